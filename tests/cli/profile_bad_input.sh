# ob-profile refuses bad input with one clear line and the design.md exit code.
source "$(dirname "$0")/../lib/assert.sh"
P="$OB_BIN/ob-profile"

"$P" --model gpt-tiny --analytic --gpu h100 -o "$TMP/good.pb" || fail "analytic profile failed"
size=$(stat -c %s "$TMP/good.pb")

# Truncated inside a field, and exactly before the 6-byte end marker (a
# field boundary, which protobuf alone would parse as a valid message).
head -c $((size / 2)) "$TMP/good.pb" > "$TMP/half.pb"
expect 65 'half.pb: (truncated|not a valid)' -- "$P" --json "$TMP/half.pb"
head -c $((size - 6)) "$TMP/good.pb" > "$TMP/cut.pb"
expect 65 'cut.pb: truncated Profile' -- "$P" --json "$TMP/cut.pb"
: > "$TMP/empty.pb"
expect 65 'empty.pb: empty file' -- "$P" --json "$TMP/empty.pb"
head -c 3000 /dev/urandom > "$TMP/noise.pb"
expect 65 'noise.pb: ' -- "$P" --json "$TMP/noise.pb"
# Noise that starts like JSON (1 in 256 of the above): the parser's message
# quotes it, newlines and all; still one line.
printf '{\n\xff\xfe\n\x1b[31m\n' > "$TMP/badjson.pb"
expect 65 'badjson.pb: not a valid ob Profile in JSON' -- "$P" --json "$TMP/badjson.pb"

# A future format_version (field 1 is serialised first: bytes 08 01).
python3 - "$TMP/good.pb" "$TMP/future.pb" <<'PY'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
assert b[0:2] == b'\x08\x01', b[0:2]
b[1] = 9
open(sys.argv[2], 'wb').write(b)
PY
expect 65 'future.pb: format_version 9 is newer than this ob reads \(1\)' -- "$P" --json "$TMP/future.pb"

# Invalid UTF-8 in a string field: protobuf's own complaint stays out of stderr.
python3 - "$TMP/good.pb" "$TMP/utf8.pb" <<'PY'
import sys
b = open(sys.argv[1], 'rb').read()
assert b'gpt-tiny' in b
open(sys.argv[2], 'wb').write(b.replace(b'gpt-tiny', b'\xff\xfe-tiny', 1))
PY
expect 65 'utf8.pb: not a valid ob Profile' -- "$P" --json "$TMP/utf8.pb"

# Missing input.
expect 66 'nonexistent.pb: cannot open' -- "$P" --json "$TMP/nonexistent.pb"

# Model configs: missing field, negative field, unknown preset, missing file.
printf 'n_layer: 2\nn_embd: 64\nn_head: 4\nvocab_size: 256\n' > "$TMP/missing.yaml"
expect 78 "missing.yaml:[0-9]*:? .*n_positions" -- "$P" --model "$TMP/missing.yaml" --analytic --gpu h100 -o "$TMP/x.pb"
printf 'n_layer: 2\nn_embd: -64\nn_head: 4\nn_positions: 32\nvocab_size: 256\n' > "$TMP/negative.yaml"
expect 78 "negative.yaml:[0-9]*: .*n_embd" -- "$P" --model "$TMP/negative.yaml" --analytic --gpu h100 -o "$TMP/x.pb"
expect 78 "unknown model 'gpt5-huge'" -- "$P" --model gpt5-huge --analytic --gpu h100 -o "$TMP/x.pb"
expect 66 "nope.yaml: " -- "$P" --model "$TMP/nope.yaml" --analytic --gpu h100 -o "$TMP/x.pb"
expect 78 "unknown GPU 'tpu9'" -- "$P" --model gpt2 --analytic --gpu tpu9 -o "$TMP/x.pb"

# Usage errors: one line ending "(try 'ob-profile --help')", exit 64.
expect 64 "try 'ob-profile --help'" -- "$P" --no-such-flag
expect 64 "try 'ob-profile --help'" -- "$P" --model gpt2 --analytic -o "$TMP/x.pb"
# A precision ob does not train in is refused, not measured as fp32 (or
# modelled as bf16) without a word; ob-launch's words and the profile's both work.
for p in fp16 half bfloat; do
  expect 64 "--precision: '$p' is not a precision: fp32 \\(float32\\) or bf16" -- \
    "$P" --model gpt-tiny --analytic --gpu h100 --dtype "$p" -o "$TMP/x.pb"
done
for p in fp32:float32 float32:float32 bf16:bfloat16 bfloat16:bfloat16; do
  "$P" --model gpt-tiny --analytic --gpu h100 --precision "${p%%:*}" --json | grep -q "\"dtype\": \"${p#*:}\"" \
    || fail "--precision ${p%%:*} did not give a ${p#*:} profile"
done
# The default is ob-launch's for the device: bf16 for a GPU, fp32 on the CPU.
"$P" --model gpt-tiny --analytic --gpu h100 --json | grep -q '"dtype": "bfloat16"' || fail "analytic default not bf16"
"$P" --model gpt-tiny --threads 1 --warmup 0 -k 1 -q --json | grep -q '"dtype": "float32"' || fail "cpu default not fp32"
# Numbers that are no size, fraction or count: not infinite, not NaN, not 0.
expect 64 "--efficiency: '1.5' is above 1" -- "$P" --model gpt2 --analytic --gpu h100 --efficiency 1.5 -o "$TMP/x.pb"
for o in --efficiency --peak-tflops --mem-gib --allreduce-gbps; do
  for v in 0 -1 inf nan; do
    expect 64 "$o: '$v' (must be a positive number|is not a finite number)" -- \
      "$P" --model gpt2 --analytic --gpu h100 "$o" "$v" -o "$TMP/x.pb"
  done
done
expect 64 "--seq-len: '-4' must be a positive number" -- "$P" --model gpt-tiny --seq-len -4 -o "$TMP/x.pb"
expect 64 "--threads: '0' must be a positive number" -- "$P" --model gpt-tiny --threads 0 -o "$TMP/x.pb"
# Refused at parsing (64), not after the model was read (78, as before).
expect 64 "--warmup: '-1' must not be negative" -- "$P" --model gpt-tiny --warmup -1 -o "$TMP/x.pb"
expect 64 "--repeats: '0' must be a positive number" -- "$P" --model gpt-tiny -k 0 -o "$TMP/x.pb"

# Nothing was left behind by the failed writes.
[ ! -e "$TMP/x.pb" ] || fail "a failed run left $TMP/x.pb"
ls "$TMP" | grep -q '\.tmp\.' && fail "temporary files left behind"

# Two programs: ob-profile does not load LibTorch; to measure layers it runs
# ob-profile-measure from beside it (through a link too), and without it
# says so (78) rather than measuring nothing.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
if needed "$P" | grep -Eq '^lib(torch|c10)'; then
  fail "ob-profile links LibTorch: $(needed "$P" | grep -E '^lib(torch|c10)' | tr '\n' ' ')"
fi
needed "$OB_BIN/ob-profile-measure" | grep -q '^libtorch' || fail "ob-profile-measure does not link LibTorch"
mkdir -p "$TMP/alone" "$TMP/linked"
cp "$P" "$TMP/alone/ob-profile"
expect 78 "^ob-profile: cannot run $TMP/alone/ob-profile-measure: No such file or directory \(ob-profile-measure measures layers; it is installed beside ob-profile\)$" -- \
  "$TMP/alone/ob-profile" --model gpt-tiny --threads 1 --warmup 0 -k 1 -q --json
"$TMP/alone/ob-profile" --model gpt-tiny --analytic --gpu h100 --json | grep -q '"mode": "PROFILE_ANALYTIC"' \
  || fail "ob-profile alone does not model"
ln -s "$P" "$TMP/linked/ob-profile"
"$TMP/linked/ob-profile" --model gpt-tiny --threads 1 --warmup 0 -k 1 -q --json | grep -q '"mode": "PROFILE_MEASURED"' \
  || fail "ob-profile through a link does not measure"
# A model larger than this machine's memory: refused before any layer is
# made (LibTorch's allocator said "internal error: [enforce fail at
# alloc_cpu.cpp:75]", exit 70, or the OOM killer ended it); one that runs
# out of memory while measuring (here under a virtual-memory limit) ends
# with 69 too, not as an internal error.
expect 69 "^ob-profile: measuring gpt3-175b needs at least [0-9]+ GiB \(every layer's weights and gradients, and the activations of a micro-batch of 1 x 2048\), more than the [0-9]+ GiB of memory available here" -- \
  "$P" --model gpt3-175b --threads 1 -q -o "$TMP/huge.pb"
expect 69 "^ob-profile: (out of memory measuring gpt2-large on cpu: .*can't allocate memory|measuring gpt2-large needs at least)" -- \
  bash -c 'ulimit -v 2500000 && exec "$@"' - "$P" --model gpt2-large --threads 1 --warmup 0 -k 1 -q -o "$TMP/large.pb"
[ ! -e "$TMP/huge.pb" ] && [ ! -e "$TMP/large.pb" ] && pass || fail "a refused measurement wrote its output"
finish
