#!/usr/bin/env bash
# A host cut off with the standby master (design/master.md), and what is
# left of it once the cut heals. Four hosts in network namespaces, the
# master inside the first, its standby on the second, as in
# launch_standby_split.sh; gpt-tiny, two pipelines of two stages.
#
# In both cases the standby's host loses its link at a step: the master
# hears three of four hosts, so it is not fenced; it carries on without
# that host, and the host's agent, having lost its master, is held by the
# standby, which has lost the master too but has no majority to take over.
#
# 1. ended: the link stays down until the master has ended the run
#    (exit 0, every loss an uninterrupted run's), then comes back. Nothing
#    of the run may linger: the standby finds the master's address refusing
#    (its process is gone) and stops once the agents' failover window has
#    passed, and the agent it held, refused by both addresses, exits. Every
#    process of the cut host is gone within 20 s of the heal (issue 72:
#    before, the standby waited 33 s from the cut and the agent then asked
#    the standby's dead address for 30 s more).
# 2. healed: the link comes back while the master still trains. The
#    standby hears the master again and stops; the agent it held goes back
#    to the master, which takes it back at the next generation
#    ("agent-rejoined"); the run ends exit 0 under the master with equal
#    losses, and nothing is left.
# Needs root, `ip netns` and python3; exit 77 (skipped) otherwise.
NAME=launch_standby_heal
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
source "$(dirname "$0")/../lib/standby.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT

STEPS=120

standby_hosts "$STEPS"
dev=${NETNS_HOSTDEV[$standby_host]}
left() { tagged | xargs -r ps -o pid,args -p | tr '\n' '|'; }
# cut_off RUN: the standby's host off; waits until the master has gone on
# without it and the standby holds that host's agent.
cut_off() {
  local run=$1
  ip link set "$dev" down || fail "cannot take $standby_host's link down"
  echo "$NAME: $run: $standby_host's link down at step $(max_step "$WORK/$run.pb")"
  lost() { grep -q " decide .*lost hosts $standby_host" "$events" 2>/dev/null || master_done; }
  wait_for 30 lost || fail "$run: the master did not go on without $standby_host: $(grep -E "detect|decide" "$events" | tr '\n' '|')"
  held() { grep -q " agent-came host=$standby_host " "$standby_events" 2>/dev/null; }
  wait_for 30 held || fail "$run: the standby does not hold $standby_host's agent: $(tr '\n' '|' < "$standby_events")"
}
# finish RUN: the master's exit 0 and the uninterrupted run's losses.
finish() {
  local run=$1
  wait "$MASTER_PID"; local rc=$?; MASTER_PID=""
  [ "$rc" = 0 ] || fail "$run: the master exited $rc: $(tail -3 "$WORK/$run.err")"
  grep -q " takeover " "$standby_events" && fail "$run: the standby took over: $(grep " takeover " "$standby_events")"
  python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/$run.pb" 1e-4 > "$WORK/$run.cmp" || fail "$run: $(cat "$WORK/$run.cmp")"
}

# 1. The run ends while the cut host's agent waits at the standby.
standby_start ended "$STEPS" 100
cut_off ended
wait_for 120 master_done || fail "ended: the run did not end: $(tail -3 "$WORK/ended.err")"
finish ended
ip link set "$dev" up || fail "cannot take $standby_host's link up"
healed_at=$(now_ms)
wait_for 20 standby_empty || fail "ended: 20 s after the heal, processes left: $(left) (standby: $(tail -2 "$standby_events" | tr '\n' '|'))"
gone_ms=$(( $(now_ms) - healed_at ))
stop=$(grep " standby-stop " "$standby_events") || fail "ended: the standby did not say why it stopped"
grep -q "refuses connections" <<< "$stop" || fail "ended: the standby stopped for another reason: $stop"
grep -q "both refused the connection" "$WORK/ended.err" || fail "ended: the agent did not say both addresses refused it: $(grep -i "stopping" "$WORK/ended.err" | tail -3 | tr '\n' '|')"
echo "$NAME: ended: nothing left ${gone_ms} ms after the heal; $(cat "$WORK/ended.cmp")"

# 2. The cut heals while the master still trains.
standby_start healed "$STEPS" 15
cut_off healed
ip link set "$dev" up || fail "cannot take $standby_host's link up"
echo "$NAME: healed: $standby_host's link up at step $(max_step "$WORK/healed.pb")"
rejoined() { grep -q " agent-rejoined host=$standby_host " "$events" 2>/dev/null || master_done; }
wait_for 30 rejoined || fail "healed: $standby_host's agent did not rejoin the master: $(grep -E "standby-stop" "$standby_events"; grep -iE "stopping|lost the" "$WORK/healed.err" | tail -3 | tr '\n' '|')"
master_done && fail "healed: the run ended before $standby_host rejoined"
grep -q " standby-stop .*answers again" "$standby_events" \
  || fail "healed: the standby did not stop on hearing the master: $(grep " standby-stop " "$standby_events")"
wait_for 120 master_done || fail "healed: the run did not end: $(tail -3 "$WORK/healed.err")"
finish healed
wait_for 20 standby_empty || fail "healed: processes left: $(left)"
echo "$NAME: healed: $(grep -c " start-workers " "$events") generations started; $(cat "$WORK/healed.cmp")"
echo "$NAME: ok"
