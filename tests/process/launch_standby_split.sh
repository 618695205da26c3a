#!/usr/bin/env bash
# No split brain (design/master.md). Four hosts in network namespaces, the
# master inside the first, its standby master on the second, as in
# launch_standby_master.sh; gpt-tiny, two pipelines of two stages.
#
# 1. The master's link goes down at step 15 for 10 s, longer than a
#    takeover needs, and comes back. The master, hearing neither its
#    standby nor more than one host, says in one line that it is fenced and
#    exits 75 without a decision after the cut; the standby takes over as
#    term 2 and ends the run "done exit 0" with every loss an uninterrupted
#    run's within 1e-4; no step was trained by two generations at once (the
#    old master started none after the cut), and nothing is left.
# 2. The standby is stopped (SIGSTOP) at step 15 for 5 s while the master is
#    healthy, then runs again: the master replaces it, nothing is taken
#    over, the run exits 0 under the master with equal losses, and the old
#    standby stops on its own saying the master answers.
# 3. The master is stopped (SIGSTOP) until the standby has taken over, then
#    runs again: it is fenced (exit 75) without a decision, and the run ends
#    under the standby with equal losses.
# Needs root, `ip netns` and python3; exit 77 (skipped) otherwise.
NAME=launch_standby_split
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
source "$(dirname "$0")/../lib/standby.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT

STEPS=60
CUT_STEP=15

standby_hosts "$STEPS"
start() { standby_start "$1" "$STEPS" "$CUT_STEP"; }

# 1. The master cut off, then back.
start cut
dev=${NETNS_HOSTDEV[$master_host]}
ip link set "$dev" down || fail "cannot take $master_host's link down"
cut_at=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
echo "$NAME: cut: $master_host's link down at step $(max_step "$WORK/cut.pb")"
wait_for 30 master_done || fail "cut: the old master still runs 30 s after its link went down: $(tail -3 "$WORK/cut.err")"
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 75 ] || fail "cut: the old master exited $rc, expected 75: $(tail -3 "$WORK/cut.err")"
fenced=$(grep " fenced " "$events") || fail "cut: the old master did not say it was fenced: $(tail -3 "$WORK/cut.err")"
# No decision of the old master after the cut: nothing it decided there
# could have started workers beside the standby's.
awk -v t="$cut_at" '$1 > t && ($3 == "decide" || $3 == "start-workers")' "$events" | grep -q . \
  && fail "cut: the old master decided after the cut: $(awk -v t="$cut_at" '$1 > t' "$events" | tr '\n' '|')"
took() { grep -q " takeover term=2 lost_master=$master_host " "$standby_events" 2>/dev/null; }
wait_for 30 took || fail "cut: no takeover: $(grep -E "leader-lost|standby" "$standby_events" | tr '\n' '|')"
sleep 4   # the link is down 10 s in all, well past the takeover
ip link set "$dev" up || fail "cannot take $master_host's link up"
echo "$NAME: cut: ${fenced#* fenced }"
ended() { grep -q " done " "$standby_events" 2>/dev/null; }
wait_for 120 ended || fail "cut: the standby did not end the run: $(tail -3 "$WORK/cut.err")"
grep -q " done exit 0$" "$standby_events" || fail "cut: $(grep " done " "$standby_events")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/cut.pb" 1e-4 > "$WORK/cut.cmp" || fail "cut: $(cat "$WORK/cut.cmp")"
wait_for 10 standby_empty || fail "cut: processes left: $(tagged | xargs -r ps -o pid,args -p | tr '\n' '|')"
echo "$NAME: cut: $(grep " takeover " "$standby_events" | cut -d' ' -f4-); $(cat "$WORK/cut.cmp")"

# 2. The standby stopped, then running again.
start stopped
standby_pid=$(pgrep -f -- "^$OB_BIN/ob-launch --standby-master-of .* --host $standby_host( |\$)" | head -1)
[ -n "$standby_pid" ] || fail "stopped: no standby process on $standby_host"
kill -STOP "$standby_pid"
echo "$NAME: stopped: the standby (pid $standby_pid) stopped at step $(max_step "$WORK/stopped.pb")"
replaced() { grep -q " standby-master-start host=" <(grep -A100 " standby-master-lost " "$events" 2>/dev/null); }
wait_for 20 replaced || fail "stopped: the master did not replace its standby: $(grep standby "$events" | tr '\n' '|')"
sleep 3
kill -CONT "$standby_pid"
wait_for 120 master_done || fail "stopped: the run did not end: $(tail -3 "$WORK/stopped.err")"
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 0 ] || fail "stopped: exit $rc: $(tail -3 "$WORK/stopped.err")"
grep -q " takeover " "$standby_events" && fail "stopped: the stopped standby took over: $(grep " takeover " "$standby_events")"
grep -q " generation=2 " "$events" && fail "stopped: a recovery without a failure: $(grep " decide " "$events" | tr '\n' '|')"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/stopped.pb" 1e-4 > "$WORK/stopped.cmp" \
  || fail "stopped: $(cat "$WORK/stopped.cmp")"
wait_for 40 standby_empty || fail "stopped: processes left: $(tagged | xargs -r ps -o pid,args -p | tr '\n' '|')"
echo "$NAME: stopped: $(grep " standby-stop " "$standby_events" | cut -d' ' -f4- | head -1); $(cat "$WORK/stopped.cmp")"
# 3. The master stopped (SIGSTOP) for longer than a takeover needs, then
#    running again: the standby takes over; the old master, finding its
#    agents and standby gone, is fenced (exit 75) with no decision after
#    it was stopped; the run ends under the standby with equal losses.
start paused
master=$(pgrep -f -- "^$OB_BIN/ob-launch --rsh " | while read -r p; do
  [ "$(ip netns identify "$p" 2>/dev/null)" = "$master_host" ] && echo "$p"; done | head -1)
[ -n "$master" ] || fail "paused: no master process in $master_host"
kill -STOP "$master"
stopped_at=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
echo "$NAME: paused: the master (pid $master) stopped at step $(max_step "$WORK/paused.pb")"
wait_for 30 took || fail "paused: no takeover: $(grep -E "leader-lost|standby" "$standby_events" | tr '\n' '|')"
sleep 2
kill -CONT "$master"
wait_for 30 master_done || fail "paused: the old master still runs 30 s after it ran again: $(tail -3 "$WORK/paused.err")"
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 75 ] || fail "paused: the old master exited $rc, expected 75: $(tail -3 "$WORK/paused.err")"
grep -q " fenced " "$events" || fail "paused: the old master did not say it was fenced: $(tail -3 "$WORK/paused.err")"
awk -v t="$stopped_at" '$1 > t && ($3 == "decide" || $3 == "start-workers")' "$events" | grep -q . \
  && fail "paused: the old master decided after it was stopped: $(awk -v t="$stopped_at" '$1 > t' "$events" | tr '\n' '|')"
wait_for 120 ended || fail "paused: the standby did not end the run: $(tail -3 "$WORK/paused.err")"
grep -q " done exit 0$" "$standby_events" || fail "paused: $(grep " done " "$standby_events")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/paused.pb" 1e-4 > "$WORK/paused.cmp" \
  || fail "paused: $(cat "$WORK/paused.cmp")"
wait_for 10 standby_empty || fail "paused: processes left: $(tagged | xargs -r ps -o pid,args -p | tr '\n' '|')"
echo "$NAME: paused: $(grep " fenced " "$events" | cut -d' ' -f4- | cut -c1-120); $(cat "$WORK/paused.cmp")"
echo "$NAME: ok"
