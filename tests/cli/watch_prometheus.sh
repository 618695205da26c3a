# ob-watch --metrics-addr: while it reads a live pipe, /metrics answers in
# Prometheus' text exposition format (checked by a small parser here, and
# by promtool when it is installed) with per-rank figures and event counts.
source "$(dirname "$0")/../lib/assert.sh"
WATCH="$OB_BIN/ob-watch"
"$OB_BIN/watch_synth" --steps 60 --seed 4 --spike 50:1.6 > "$TMP/run.pb"

# The pipe stays open until the test has scraped (the fifo's writer waits).
mkfifo "$TMP/fifo" "$TMP/go"
( cat "$TMP/run.pb"; read -r _ < "$TMP/go" ) > "$TMP/fifo" &
WRITER=$!
"$WATCH" --json --metrics-addr 127.0.0.1:0 < "$TMP/fifo" > "$TMP/events" 2> "$TMP/log" &
WATCHER=$!

addr=""
for _ in $(seq 100); do
  addr=$(grep -Eo 'http://127\.0\.0\.1:[0-9]+/metrics' "$TMP/log" | head -1)
  [ -n "$addr" ] && break
  sleep 0.05
done
[ -n "$addr" ] && pass || fail "no 'serving ... http://127.0.0.1:PORT/metrics' line: $(cat "$TMP/log")"

scrape() {  # scrape URL OUT: curl when present, else python's urllib
  if command -v curl >/dev/null; then curl -fsS "$1" > "$2"
  else python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1" > "$2"
  fi
}
# Wait until the whole recording has been taken in, then scrape.
for _ in $(seq 100); do
  scrape "$addr" "$TMP/page" 2>/dev/null && grep -q '^ob_last_step{host="node1",rank="0",pipeline="0",stage="0"} 59$' "$TMP/page" && break
  sleep 0.05
done
python3 - "$TMP/page" <<'PY' && pass || fail "the page is not valid exposition text: $(head -c 600 "$TMP/page")"
import re, sys
text = open(sys.argv[1]).read()
assert text.endswith("\n")
name = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
sample = re.compile(rf"^({name})(\{{{label}(?:,{label})*\}})? (\S+)$")
types, helps, seen = {}, set(), {}
for line in text.splitlines():
    if line.startswith("# HELP "):
        helps.add(line.split()[2]); continue
    if line.startswith("# TYPE "):
        _, _, n, t = line.split(" ", 3)
        assert t in ("counter", "gauge"), line
        assert n not in types, "TYPE twice: " + n
        types[n] = t; continue
    assert not line.startswith("#"), line
    m = sample.match(line)
    assert m, "bad sample line: " + line
    n, labels, value = m.groups()
    assert n in types, "no TYPE before " + n
    assert value in ("NaN", "+Inf", "-Inf") or float(value) == float(value), line
    key = (n, labels)
    assert key not in seen, "duplicate series " + line
    seen[key] = float(value)
assert set(types) <= helps
ranks = {l for (n, l) in seen if n == "ob_step_seconds"}
assert len(ranks) == 4, ranks
assert seen[("ob_watch_events_total", '{kind="loss_spike"}')] == 1, seen
assert seen[("ob_watch_events_total", '{kind="straggler"}')] == 0
assert seen[("ob_generation", None)] == 1
assert seen[("ob_watch_records_total", None)] > 240
for n in ("ob_compute_seconds", "ob_tokens_per_second", "ob_loss", "ob_memory_bytes", "ob_seconds_since_heard"):
    assert any(k[0] == n for k in seen), n
PY
if command -v promtool >/dev/null; then
  promtool check metrics < "$TMP/page" && pass || fail "promtool check metrics"
fi
# Only GET /metrics: anything else is 404, other methods 405.
code=$(python3 - "${addr%/metrics}" <<'PY'
import sys, urllib.request, urllib.error
codes = []
for path, method in (("/", "GET"), ("/metrics", "POST")):
    try:
        urllib.request.urlopen(urllib.request.Request(sys.argv[1] + path, method=method, data=b"" if method == "POST" else None))
        codes.append("200")
    except urllib.error.HTTPError as e:
        codes.append(str(e.code))
print(" ".join(codes))
PY
)
[ "$code" = "404 405" ] && pass || fail "expected 404 405, got '$code'"

echo > "$TMP/go"   # end the stream: ob-watch finishes
wait "$WRITER"
wait "$WATCHER"; rc=$?
[ "$rc" = 1 ] && pass || fail "ob-watch exited $rc (expected 1: a loss spike), log: $(cat "$TMP/log")"
grep -q EVENT_LOSS_SPIKE "$TMP/events" && pass || fail "no loss spike event"

# Addresses: HOST:PORT only, and bound exactly where told.
expect 64 "give HOST:PORT" -- "$WATCH" --metrics-addr 9100 "$TMP/run.pb"
# Past 65535: getaddrinfo took 99999 and it listened on 34463 instead.
expect 64 "'99999' is not a port \(0 to 65535\)" -- "$WATCH" --metrics-addr 127.0.0.1:99999 "$TMP/run.pb"
expect 69 "cannot listen|Cannot assign|not known|Name or service" -- "$WATCH" --metrics-addr 192.0.2.1:9100 "$TMP/run.pb"
finish
