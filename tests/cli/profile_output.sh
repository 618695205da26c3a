# ob-profile's output rules: -o, '-', stdin, --json, and no binary to a terminal.
source "$(dirname "$0")/../lib/assert.sh"
P="$OB_BIN/ob-profile"

"$P" --model gpt2 --analytic --gpu a100-80gb -o "$TMP/a.pb" || fail "-o FILE failed"
"$P" --model gpt2 --analytic --gpu a100-80gb -o - > "$TMP/b.pb" || fail "-o - failed"
"$P" --model gpt2 --analytic --gpu a100-80gb > "$TMP/c.pb" || fail "stdout pipe failed"
# Same bytes except the creation time: compare the JSON without it.
for f in a b c; do "$P" --json "$TMP/$f.pb" | grep -v created_unix_ms > "$TMP/$f.json"; done
cmp -s "$TMP/a.json" "$TMP/b.json" && cmp -s "$TMP/a.json" "$TMP/c.json" || fail "-o FILE, -o - and a pipe differ"
# Reading from stdin: explicit '-' and implicit when stdin is a pipe.
"$P" --json - < "$TMP/a.pb" | grep -v created_unix_ms > "$TMP/d.json" || fail "--json - failed"
"$P" --json < "$TMP/a.pb" | grep -v created_unix_ms > "$TMP/e.json" || fail "--json <stdin failed"
cmp -s "$TMP/a.json" "$TMP/d.json" && cmp -s "$TMP/a.json" "$TMP/e.json" || fail "stdin reads differ"
grep -q '"format_version": 1' "$TMP/a.json" || fail "JSON lacks format_version"
grep -q '"mode": "PROFILE_ANALYTIC"' "$TMP/a.json" || fail "JSON lacks mode"
# Re-emitting a profile through a pipe keeps it byte-identical.
"$P" < "$TMP/a.pb" > "$TMP/f.pb" && cmp -s "$TMP/a.pb" "$TMP/f.pb" || fail "pass-through changed the profile"

# Binary to a terminal is refused (before any work), naming -o and --json.
if command -v script > /dev/null; then
  script -qec "$P --model gpt2 --analytic --gpu h100" /dev/null > "$TMP/tty.out" 2>&1; rc=$?
  [ "$rc" = 64 ] || fail "binary to a terminal: exit $rc, expected 64"
  grep -q -- '-o FILE' "$TMP/tty.out" && grep -q -- '--json' "$TMP/tty.out" || fail "refusal does not name -o and --json: $(cat "$TMP/tty.out")"
  # A profile printed to a terminal is a table.
  script -qec "$P $TMP/a.pb" /dev/null > "$TMP/tty2.out" 2>&1 || fail "table to terminal failed"
  grep -q '^# ob profile (analytic)' "$TMP/tty2.out" || fail "no table on a terminal"
else
  echo "skipping terminal checks: script(1) not installed"
fi

# --version and --version -v.
"$P" --version | grep -Eq '^ob-profile [0-9]+\.[0-9]+\.[0-9]+' || fail "--version"
"$P" --version -v > "$TMP/v.txt"
for k in libtorch cuda nccl protobuf; do grep -q "^$k: " "$TMP/v.txt" || fail "--version -v lacks $k"; done
# --help goes to stdout with exit 0.
"$P" --help > "$TMP/h.txt" 2> "$TMP/h.err" && [ -s "$TMP/h.txt" ] && [ ! -s "$TMP/h.err" ] || fail "--help"
# --concurrency: the layers timed while other processes train them; the
# profile says so, records the process's own memory, each layer's update
# and the contention curve, and no load process outlives the profile.
"$P" --model gpt-tiny --threads 1 --concurrency 3 -k 3 --warmup 1 --allreduce-max 2 -o "$TMP/c3.pb" \
  || fail "--concurrency 3"
"$P" --json "$TMP/c3.pb" > "$TMP/c3.json"
python3 - "$TMP/c3.json" <<'PY' && pass || fail "--concurrency 3: $(head -c 300 "$TMP/c3.json")"
import json, sys
p = json.load(open(sys.argv[1]))
d = p["device"]
assert d["concurrency"] == 3, d
assert int(d["process_bytes"]) > 10 << 20, d
assert all(l["update_seconds"] > 0 for l in p["layers"]), [l.get("update_seconds") for l in p["layers"]]
# The slowdown with 1..3 computing at once: 1 alone, then never below 1
# (k processes do not each compute faster than one alone).
c = d["contention"]
assert len(c) == 3 and c[0] == 1 and all(1 <= x < 100 for x in c), c
PY
pgrep -f -- "--concurrency 3 -k 3" > /dev/null && fail "a load process outlived ob-profile" || pass
expect 64 'concurrency' -- "$P" --model gpt-tiny --concurrency 0 -o "$TMP/c0.pb"
finish
