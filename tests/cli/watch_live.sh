# ob-watch on a live stream with the wall clock: a stream replayed in real
# time in which one rank stops (its peers keep beating) gives EVENT_HANG
# for that rank between 3 and 4 s (the default --hang-timeout of 3 s, checked
# every 0.2 s) after its last record arrived.
source "$(dirname "$0")/../lib/assert.sh"
WATCH="$OB_BIN/ob-watch"
"$OB_BIN/watch_synth" --steps 100 --seed 6 --compute 0.08 --stop 2:15 > "$TMP/run.pb"

# Replays records at their recorded pace; notes when rank 2's last one went.
python3 - "$TMP/run.pb" "$TMP/last" "$OB_SOURCE_DIR/tests/lib" <<'PY' | "$WATCH" --json --clock wall > "$TMP/events" 2> "$TMP/log"
import os, sys, time
sys.path.insert(0, sys.argv[3])
import metrics
data = open(sys.argv[1], "rb").read()
recs = [(f.get(8, 0), f.get(metrics.RANK, 0), raw) for raw, f in metrics.frames(data, sys.argv[1])]
last_of_2 = max(idx for idx, r in enumerate(recs) if r[1] == 2)
start, t0 = time.time(), recs[0][0]
out = sys.stdout.buffer
for idx, (ms, rank, raw) in enumerate(recs):
    if ms > recs[last_of_2][0] + 5000: break  # enough silence to tell
    delay = start + (ms - t0) / 1000 - time.time()
    if delay > 0: time.sleep(delay)
    out.write(raw); out.flush()
    if idx == last_of_2:
        open(sys.argv[2], "w").write("%d" % int(time.time() * 1000))
PY
python3 - "$TMP/events" "$TMP/last" <<'PY' && pass || fail "no timely hang: $(cat "$TMP/events" "$TMP/log")"
import json, sys
last = int(open(sys.argv[2]).read())
hangs = [json.loads(l) for l in open(sys.argv[1]) if '"EVENT_HANG"' in l]
assert hangs, "no EVENT_HANG"
h = hangs[0]
assert h["host"] == "node3" and h["rank"] == 2, h
delay = (int(h["unix_ms"]) - last) / 1000
assert 3.0 <= delay <= 4.0, delay
print("hang detected %.2f s after rank 2's last record" % delay)
PY
finish
