# ob-watch --attach --act on a real run: 4 local hosts, gpt-tiny in 2
# pipelines of 2 stages, rank 2 stopped (SIGSTOP) before step 40 by
# ob-launch --inject. ob-watch, attached to the master's control socket,
# names the hung rank and its host within 5 s of its last record, asks the
# master to exclude that host, and the run recovers on the other pipeline
# and trains to its last step. The master's own hang bound is raised to 30 s:
# it would otherwise restart in place from the snapshots at 3 s itself (a
# single hang is the master's to handle; ob-watch excludes a host on its
# own evidence or on repeated hangs), racing ob-watch's action.
NAME=watch_act
source "$(dirname "$0")/../lib/launch.sh"
[ -x "$OB_BIN/ob-watch" ] || fail "no $OB_BIN/ob-watch"
"$OB_BIN/ob-launch" --help | grep -q -- --inject || skip "this ob-launch has no --inject"
METRICS_PY="$OB_SOURCE_DIR/tests/lib/metrics.py"
make_pipelines 4 1
STEPS=120

timeout 240 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run" \
  --steps "$STEPS" --data "$OB_SOURCE_DIR/README.md" --metrics "$WORK/metrics.pb" \
  --hang-timeout 30 --inject "2:hang=40" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
MASTER_PID=$!
wait_for 30 test -S "$WORK/run/control.sock" || fail "no control socket: $(tail -3 "$WORK/err")"
# Only the hang is under test: two cores shared by four workers make
# stragglers of their own.
timeout 240 "$OB_BIN/ob-watch" --attach "$WORK/run" --act --json --straggler-ratio 10 \
  > "$WORK/events" 2> "$WORK/watch.err" &
WATCH_PID=$!
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
wait "$WATCH_PID"; wrc=$?
[ "$rc" = 0 ] || fail "ob-launch exited $rc: $(tail -5 "$WORK/err")"
[ "$wrc" = 1 ] || fail "ob-watch exited $wrc (expected 1, anomalies): $(tail -3 "$WORK/watch.err")"

HOST3="${TAG}h3"
python3 - "$WORK/events" "$WORK/metrics.pb" "$HOST3" "$METRICS_PY" <<'PY' || fail "events: $(cut -c 1-300 "$WORK/events")"
import json, re, sys
sys.path.insert(0, sys.argv[4].rsplit("/", 1)[0])
import metrics
events = [json.loads(l) for l in open(sys.argv[1])]
host = sys.argv[3]
last = max(r.get(8, 0) for r in metrics.records(sys.argv[2]) if r.get(3, 0) == 2 and r.get(7, 1) == 1)
hangs = [e for e in events if e["kind"] == "EVENT_HANG" and e["rank"] == 2]
assert hangs, "no hang of rank 2"
h = hangs[0]
assert h["host"] == host, h
delay = (int(h["unix_ms"]) - last) / 1000
assert 2.5 <= delay <= 5.0, "hang found %.2f s after rank 2's last record" % delay
acts = [e for e in events if e["kind"] == "EVENT_ACTION" and " hang: " in e["request"]]
assert acts and re.match(r"run=[0-9a-f]{16} exclude %s hang: " % host, acts[0]["request"]), acts
assert acts[0]["evidence"]["ok"] == 1, acts[0]
rec = [e for e in events if e["kind"] == "EVENT_RECOVERY"]
assert rec and int(rec[0]["generation"]) >= 2, "no recovery"
# The hung rank's pipeline peer may exit when its collective loses it: a
# secondary failure, named as such.
others = [e for e in events if e["kind"] == "EVENT_LOSS_NAN" or
          e["kind"] == "EVENT_CRASH" and e["evidence"]["secondary"] != 1]
assert not others, others
print("watch_act: hang of rank 2 on %s found %.2f s after its last record; excluded; %s" % (host, delay, rec[0]["message"]))
PY
max=$(python3 "$METRICS_PY" max-step "$WORK/metrics.pb")
[ "$max" = $((STEPS - 1)) ] || fail "training stopped at step $max"
grep -q "exclude.*host=$HOST3" "$WORK/run/events.log" || fail "the master did not record the exclusion"
echo "$NAME: ok"
