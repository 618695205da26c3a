# ob-launch's two programs: ob-launch (the master and the agents) does not
# load LibTorch, ob-launch-worker (every worker, standby and device probe)
# does; each refuses the other's roles with one line; the probe reports
# what a worker here sees; ob-launch --version -v asks it; and an
# ob-launch whose worker program is missing says so before it starts any
# host (exit 78).
source "$(dirname "$0")/../lib/assert.sh"
L="$OB_BIN/ob-launch"
W="$OB_BIN/ob-launch-worker"

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
if needed "$L" | grep -Eq '^lib(torch|c10)'; then
  fail "ob-launch links LibTorch: $(needed "$L" | grep -E '^lib(torch|c10)' | tr '\n' ' ')"
else
  pass
fi
needed "$W" | grep -q '^libtorch' && pass || fail "ob-launch-worker does not link LibTorch: $(needed "$W" | tr '\n' ' ')"

expect 64 "^ob-launch: --worker and --probe are ob-launch-worker's \(started by agents\)" -- "$L" --worker --rank 0
expect 64 "^ob-launch: --standby-worker is ob-launch-worker's \(started by agents\)" -- "$L" --standby-worker
expect 64 "^ob-launch: ob-launch-worker is started by ob-launch's agents" -- "$W" --steps 3

# The probe: no GPU on --device cpu, and the runtime line a worker would log.
expect 0 '' -- "$W" --probe --device cpu
[ "$(head -1 "$TMP/out")" = "gpus 0" ] && pass || fail "probe: $(cat "$TMP/out")"
grep -Eq '^runtime device cpu, backend gloo, precision fp32, [0-9]+ threads?, LibTorch [0-9.]+' "$TMP/out" \
  && [ "$(grep -c '' "$TMP/out")" = 2 ] && pass || fail "probe: $(cat "$TMP/out")"
expect 0 '' -- "$W" --probe --device cpu --precision bf16
grep -q '^runtime device cpu, backend gloo, precision bf16,' "$TMP/out" && pass || fail "probe bf16: $(cat "$TMP/out")"

# --version -v: the worker's line comes from ob-launch-worker.
expect 0 '' -- "$L" --version -v --device cpu
grep -Eq '^worker: device cpu, backend gloo, precision fp32, [0-9]+ threads?, LibTorch [0-9.]+' "$TMP/out" "$TMP/err" \
  && pass || fail "--version -v: $(cat "$TMP/out" "$TMP/err")"

# ob-launch installed without its worker program.
mkdir -p "$TMP/alone"
cp "$L" "$TMP/alone/ob-launch"
"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q -o "$TMP/tiny.pb" \
  || fail "ob-profile"
printf 'a\nb\n' > "$TMP/hosts.txt"
"$OB_BIN/ob-plan" --hosts "$TMP/hosts.txt" -g 1 -f 0 -B 4 -q -o "$TMP/plan.pb" "$TMP/tiny.pb" || fail "ob-plan"
(umask 077; echo "secret-$$-for-the-tests" > "$TMP/secret")
expect 78 "^ob-launch: $TMP/alone/ob-launch-worker: No such file or directory \(ob-launch runs its workers with ob-launch-worker, installed beside it on every host\)$" \
  -- "$TMP/alone/ob-launch" --rsh local --secret-file "$TMP/secret" --run-dir "$TMP/run" --steps 3 \
  "$TMP/plan.pb" "$TMP/hosts.txt"
[ ! -e "$TMP/run" ] && pass || fail "a run directory was made: $(ls "$TMP/run")"
finish
