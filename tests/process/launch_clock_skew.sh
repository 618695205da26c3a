#!/usr/bin/env bash
# Hosts whose clocks disagree, as a cluster with a broken NTP client has
# them: 4 local hosts in 2 pipelines of 2 stages; host 2's processes run two
# minutes behind and host 3's two minutes ahead (OB_TEST_CLOCK_SKEW_MS,
# which ob::UnixMs adds). Host 2's worker is killed -9 after step 15.
#  1. events.log's worker-exit latency_ms and the recovered line's
#     teardown_ms are on the master's clock: seconds, not two minutes
#     (before 2026-11-29: latency_ms about 120000, teardown_ms about 120000);
#  2. ob-watch over the run's --metrics (its stream clock) finds no hang:
#     before, host 3's first record moved "now" two minutes on, every other
#     rank looked silent, and ob-watch --act would have excluded them;
#  3. the run trains to its end and exits 0.
NAME=launch_clock_skew
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
STEPS=40
cat > "$WORK/rsh" <<'SH'
#!/usr/bin/env bash
host=$1; shift
case $host in
  *h2) exec env OB_TEST_CLOCK_SKEW_MS=-120000 "$@" ;;
  *h3) exec env OB_TEST_CLOCK_SKEW_MS=120000 "$@" ;;
  *) exec "$@" ;;
esac
SH
chmod +x "$WORK/rsh"

timeout 240 "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind 127.0.0.1 --secret-file "$WORK/secret" \
  --run-dir "$WORK/run" --steps "$STEPS" --data "$OB_SOURCE_DIR/tests/data/corpus.txt" \
  --metrics "$WORK/run.pb" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/run.err" &
MASTER_PID=$!
wait_step run 15 || fail "no step 15: $(tail -3 "$WORK/run.err")"
victim=""
for r in 0 1 2 3; do
  p=$(worker_pid $r)
  [ -n "$p" ] && grep -qsa "OB_HOST=${TAG}h2" "/proc/$p/environ" && victim=$p
done
[ -n "$victim" ] || fail "no worker on ${TAG}h2"
kill -9 "$victim"
run_wait
[ "$RC" = 0 ] || fail "exit $RC: $(tail -3 "$WORK/run.err")"
grep -q "trained $STEPS steps: final loss" "$WORK/run.err" || fail "no closing line: $(tail -2 "$WORK/run.err")"

exit_line=$(grep " worker-exit .*host=${TAG}h2 killed by signal 9" "$WORK/run/events.log") \
  || fail "no worker-exit line: $(grep worker-exit "$WORK/run/events.log")"
latency=$(sed -n 's/.* latency_ms=\([0-9]*\).*/\1/p' <<< "$exit_line")
[ -n "$latency" ] && [ "$latency" -lt 10000 ] || fail "worker-exit by host 2's clock: $exit_line"
rec=$(grep " recovered generation=2 " "$WORK/run/events.log") || fail "no recovered line"
teardown=$(sed -n 's/.* teardown_ms=\([0-9]*\).*/\1/p' <<< "$rec")
[ -n "$teardown" ] && [ "$teardown" -lt 30000 ] || fail "teardown by host 3's clock: $rec"
echo "$NAME: latency_ms=$latency; ${rec#* recovered }"

"$OB_BIN/ob-watch" --json "$WORK/run.pb" > "$WORK/events" 2> "$WORK/watch.err"
python3 - "$WORK/events" <<'PY' || fail "ob-watch: $(cut -c 1-300 "$WORK/events")"
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
hangs = [e["message"] for e in events if e["kind"] == "EVENT_HANG"]
assert not hangs, hangs
crashes = [e for e in events if e["kind"] == "EVENT_CRASH"]
assert crashes, "the kill was not seen"
print("launch_clock_skew: ob-watch: %d events, no hang" % len(events))
PY
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
