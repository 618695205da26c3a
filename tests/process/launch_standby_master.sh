#!/usr/bin/env bash
# The master's host lost (design/master.md): four hosts, each in its own
# network namespace on a bridge; the master runs inside the first host's
# namespace (--master-host), its standby master on the second
# (--standby-master auto), agents through an ssh-like --rsh (netns_rsh).
# gpt-tiny in two pipelines of two stages trains on the fixed corpus; at
# step 15 every process of the master's namespace (the master, its agent,
# its workers) is SIGKILLed and its link goes down, as when a machine loses
# power. The standby takes over as term 2 with the three other hosts, the
# next generation starts from the survivors' snapshots (no checkpoint), and
# the run ends "done exit 0" in the standby's events.log with every step
# trained, each loss an uninterrupted run's within 1e-4 (--metrics, written
# by the master and then the standby, holds them all), the checkpoints
# (--ckpt-every 10) going on under the standby to the last step's, and
# nothing left.
# Prints the time from the kill to the next completed step. With
# VICTIM=other (bench/standby_master.sh) the last host loses power instead,
# for the same figure without a takeover. Needs root, `ip netns` and
# python3; exit 77 (skipped) otherwise. The namespaces, bridge and links are
# removed on every path.
NAME=launch_standby_master
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
source "$(dirname "$0")/../lib/standby.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT

STEPS=60
CUT_STEP=15

standby_hosts "$STEPS"
echo "$NAME: ${#hosts[@]} namespaces; the master on $master_host, its standby on $standby_host"

start=$(now_ms)
ip netns exec "$master_host" "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind "${NETNS_ADDR[$master_host]}" \
  --master-host "$master_host" --standby-master auto --secret-file "$WORK/secret" \
  --run-dir "$WORK/run" --steps "$STEPS" --data "$OB_SOURCE_DIR/tests/data/corpus.txt" \
  --ckpt-dir "$WORK/ckpt" --ckpt-every 10 \
  --metrics "$WORK/run.pb" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
MASTER_PID=$!
events="$WORK/run/events.log"
standby_events="$WORK/run/standby-$standby_host/events.log"
err_tail() { tail -n "${1:-3}" "$WORK/err" | tr '\n' '|'; }

following() { grep -q " standby-master host=$standby_host address=" "$events" 2>/dev/null || master_done; }
wait_for 60 following || fail "no standby master followed in 60 s: $(err_tail)"
master_done && fail "the master exited early: $(err_tail 5)"
at_cut() { [ "$(max_step "$WORK/run.pb")" -ge "$CUT_STEP" ] || master_done; }
wait_for 90 at_cut || fail "no step $CUT_STEP in 90 s: $(err_tail)"
master_done && fail "the master exited before step $CUT_STEP: $(err_tail 5)"
grep -q " detect " "$events" && fail "a failure before the cut: $(grep " detect " "$events" | head -1)"
[ -s "$standby_events" ] || fail "the standby keeps no events.log at $standby_events"

if [ "${VICTIM:-master}" = other ]; then  # the same power loss, of a host the master does not run on
  victim=${hosts[3]}
  cut_step=$(max_step "$WORK/run.pb")
  kill_ms=$(now_ms)
  # shellcheck disable=SC2046
  kill -9 $(ip netns pids "$victim") 2>/dev/null
  ip link set "${NETNS_HOSTDEV[$victim]}" down || fail "cannot take $victim's link down"
  recovered() { grep -q " recovered generation=2 " "$events" 2>/dev/null; }
  wait_for 60 recovered || fail "no step trained within 60 s of the kill: $(err_tail 6)"
  echo "$NAME: killed every process of $victim (not the master's host) at step $cut_step"
  echo "$NAME: from the kill to the next completed step: $(( $(now_ms) - kill_ms )) ms"
  wait_for 120 master_done || fail "the run did not end: $(err_tail)"
  wait "$MASTER_PID"; rc=$?; MASTER_PID=""
  [ "$rc" = 0 ] || fail "exit $rc: $(err_tail)"
  python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/run.pb" 1e-4 || fail "losses"
  exit 0
fi

# Power loss of the master's host.
cut_step=$(max_step "$WORK/run.pb")
kill_ms=$(now_ms)
# shellcheck disable=SC2046
kill -9 $(ip netns pids "$master_host") 2>/dev/null
ip link set "${NETNS_HOSTDEV[$master_host]}" down || fail "cannot take $master_host's link down"
wait "$MASTER_PID" 2>/dev/null
MASTER_PID=""
echo "$NAME: killed every process of $master_host at step $cut_step"

# The next completed step: the first of the standby's generation (its
# "recovered" line is written when every rank of it has one).
next_step() { grep -q " recovered generation=" "$standby_events" 2>/dev/null; }
wait_for 60 next_step || fail "no step trained within 60 s of the kill: $(err_tail 6)"
resumed_ms=$(( $(now_ms) - kill_ms ))
echo "$NAME: from the kill to the next completed step: $resumed_ms ms"

ended() { grep -q " done " "$standby_events" 2>/dev/null; }
wait_for 120 ended || fail "the standby did not end the run in 120 s: $(err_tail 6)"
grep -q " done exit 0$" "$standby_events" || fail "the run did not end well: $(grep " done " "$standby_events")"
takeover=$(grep " takeover term=2 lost_master=$master_host " "$standby_events") \
  || fail "no takeover of $master_host logged: $(grep -E " (leader-lost|takeover|decide) " "$standby_events" | tr '\n' '|')"
rec=$(grep " recovered generation=" "$standby_events" | tail -1) || fail "no recovery logged by the standby"
grep -E " start-workers generation=[0-9]+ " "$standby_events" | tail -1 | grep -q " source=snapshots " \
  || fail "the standby's generation did not start from snapshots: $(grep " start-workers " "$standby_events" | tail -1)"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/run.pb" 1e-4 > "$WORK/run.cmp" \
  || fail "losses: $(cat "$WORK/run.cmp")"
grep -Eq "trained [0-9]+ steps: final loss" "$WORK/err" || fail "no closing line: $(err_tail)"
# The checkpoints go on under the standby: the last step's, committed by it.
grep -q " checkpoint step=$((STEPS - 1)) " "$standby_events" \
  || fail "the standby committed no checkpoint of step $((STEPS - 1)): $(grep " checkpoint " "$standby_events" | tail -2 | tr '\n' '|')"
"$OB_BIN/ob-ckpt" verify "$(readlink -f "$WORK/ckpt/$(cat "$WORK/ckpt/latest")")" > /dev/null \
  || fail "the latest checkpoint does not verify"

# Nothing left, in any namespace.
wait_for 10 standby_empty || fail "processes left: $(tagged | xargs -r ps -o pid,args -p | tr '\n' '|')"
echo "$NAME: ${takeover#* takeover }; $(cat "$WORK/run.cmp"); ${rec#* recovered }"
echo "$NAME: ok in $(( $(now_ms) - start )) ms"
