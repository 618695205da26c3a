#!/usr/bin/env bash
# The standby seed (lib/ob/launch/agent/standby_seed.h): 2 local hosts, one
# worker each, 40 steps.
#  1. Each agent's seed loads once and its standbys are forked from it: the
#     agent says so; a standby on h1 is the agent's child (adopted: the
#     agent is a child subreaper), not the seed's, in a process group of
#     its own, and shows in /proc its own command line ("ob-launch-worker
#     --standby-worker") and environment (its OB_HOST, its store at fd 4;
#     none of the seed's padding), with descriptors 3 (snapshot arena) and
#     4 (store) and nothing at 5 or 6 (the seed's placeholders);
#  2. kill -9 of h1's seed, then of the worker on h1 after step 15: the
#     agent says the seed is gone and starts standbys by exec; training
#     recovers from the snapshots with the uninterrupted run's losses, and
#     nothing is left behind;
#  2b. --standby off: no spare standby, yet every worker, the recovery's
#     after a kill -9 of h1's worker too, is forked from its host's seed;
#  3. --standby exec: no seed; the standbys are started by exec (children
#     of their agent all the same) and the run trains to its end;
#  4. a worker command leaves an orphan that dies 0.3 s later: the agent,
#     its subreaper, reaps it and says so; no zombie stays.
NAME=launch_seed
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_cluster 2
STEPS=40
RUN_RANKS=2 reference_run "$STEPS"

# of_host PATTERN HOST: pids whose command line matches PATTERN, of HOST.
of_host() {
  local p
  for p in $(pgrep -f -- "$1"); do
    grep -qsa "OB_HOST=$2\b" "/proc/$p/environ" && echo "$p"
  done
}
run_start seed "$STEPS"
wait_step seed 10 || fail "did not reach step 10: $(tail -3 "$WORK/seed.err")"
for h in h1 h2; do
  grep -q "${TAG}$h:.*standby seed loaded in [0-9]* ms, pid [0-9]*: standbys fork from it" "$WORK/seed.err" \
    || fail "$h: its seed did not load: $(grep -i seed "$WORK/seed.err" | head -3)"
done
seed=$(of_host "--seed-standby-workers" "${TAG}h1")
[ "$(grep -c . <<< "$seed")" = 1 ] || fail "not one seed on h1: '$seed'"
agent=$(pgrep -f -- "--agent .*--host ${TAG}h1( |\$)")
sb=""
for p in $(of_host "--standby-worker" "${TAG}h1"); do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ob-launch-worke ] && sb=$p
done
[ -n "$sb" ] || fail "no standby on h1"
ppid=$(awk '/^PPid:/ { print $2 }' "/proc/$sb/status")
[ "$ppid" = "$agent" ] || fail "the standby's parent is $ppid, not the agent ($agent; the seed is $seed)"
[ "$(ps -o pgid= -p "$sb" | tr -d ' ')" = "$sb" ] || fail "the standby does not lead its own process group"
cmd=$(tr '\0' ' ' < "/proc/$sb/cmdline" | sed 's/ *$//')
[[ "$cmd" =~ ob-launch-worker\ --standby-worker$ ]] || fail "the standby's command line: '$cmd'"
env=$(tr '\0' '\n' < "/proc/$sb/environ")
grep -qx "OB_HOST=${TAG}h1" <<< "$env" || fail "the standby's environment has no OB_HOST: $(head -c 300 <<< "$env")"
grep -qx "OB_STORE_FD=4" <<< "$env" || fail "the standby's environment has no OB_STORE_FD"
! grep -q "OB_SEED_ROOM" <<< "$env" || fail "the standby shows the seed's environment"
[ -e "/proc/$sb/fd/3" ] && [ -e "/proc/$sb/fd/4" ] || fail "the standby lacks fd 3 or 4: $(ls -l "/proc/$sb/fd")"
[ ! -e "/proc/$sb/fd/5" ] && [ ! -e "/proc/$sb/fd/6" ] || fail "the standby holds fd 5 or 6: $(ls -l "/proc/$sb/fd")"
[[ "$(readlink "/proc/$sb/fd/4")" == socket:* ]] || fail "the standby's fd 4 is not its store socket"
echo "$NAME: standby $sb on h1: parent $ppid (agent), seed $seed; '$cmd'"

kill -9 "$seed"
wait_for 5 grep -q "${TAG}h1:.*standby seed: it exited (killed by signal 9); standbys start by exec" "$WORK/seed.err" \
  || fail "the agent did not see its seed die: $(grep -i seed "$WORK/seed.err" | tail -3)"
# kill_h1_worker RUN STEP WHAT: once RUN reported STEP, kill -9 of h1's
# worker; RUN recovers in place with the reference's losses.
kill_h1_worker() {
  local victim
  wait_step "$1" "$2" || fail "$3: did not reach step $2: $(tail -3 "$WORK/$1.err")"
  victim=$(for p in $(pgrep -x ob-worker-0) $(pgrep -x ob-worker-1); do
    grep -qsa "OB_HOST=${TAG}h1\b" "/proc/$p/environ" && echo "$p"; done | head -1)
  [ -n "$victim" ] || fail "$3: no worker on h1"
  kill -9 "$victim"
  run_wait
  check_recovered "$1" "$STEPS" "$3"
}
kill_h1_worker seed 15 "kill -9 of h1's seed, then of its worker"

# 2b. --standby off: no spare standby, but the workers fork from the seed,
# and so do those of the recovery after a kill -9 of h1's worker.
run_start off "$STEPS" --standby off
kill_h1_worker off 10 "--standby off, kill -9 of h1's worker"
forked=$(grep -c "worker rank [0-9] started, pid [0-9]*, forked from the seed" "$WORK/off.err")
[ "$forked" -ge 3 ] && ! grep -q "worker rank [0-9] started, pid [0-9]*, by exec" "$WORK/off.err" \
  || fail "--standby off: workers not forked from the seed: $(grep "worker rank [0-9] started" "$WORK/off.err")"
echo "$NAME: --standby off: $forked workers forked from the seeds, the recovery's among them"

run_start exec 10 --standby exec
wait_step exec 3 || fail "--standby exec: did not reach step 3: $(tail -3 "$WORK/exec.err")"
[ -z "$(of_host "--seed-standby-workers" "${TAG}h1")" ] || fail "--standby exec: a seed runs"
sb=""
for p in $(of_host "--standby-worker" "${TAG}h1"); do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ob-launch-worke ] && sb=$p
done
[ -n "$sb" ] || fail "--standby exec: no standby on h1"
run_wait
[ "$RC" = 0 ] || fail "--standby exec: exit $RC: $(tail -3 "$WORK/exec.err")"
grep -q "${TAG}h1:.*no standby seed (--standby exec)" "$WORK/exec.err" || fail "--standby exec: the agent did not say it"
! grep -q "standby seed loaded" "$WORK/exec.err" || fail "--standby exec: a seed loaded"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"

STAND_IN_CMD="(sleep 0.3 &); exec sleep 60" stand_in_start orphan
agents=$(pgrep -f -- "--agent .*--host ${TAG}h")
[ "$(grep -c . <<< "$agents")" = 2 ] || fail "orphan: not 2 agents: '$agents'"
zombies() { for a in $agents; do ps -o pid=,stat=,args= --ppid "$a"; done | awk '$2 ~ /^Z/'; }
reaped() { [ "$(grep -c "reaped pid [0-9]* (sleep), a process this agent adopted as subreaper (exit status 0)" \
  "$WORK/orphan.err")" -ge 2 ]; }
wait_for 5 reaped || fail "orphan: the agents did not reap their orphans: $(zombies)"
[ -z "$(zombies)" ] || fail "orphan: zombies: $(zombies)"
stop_master orphan
echo "$NAME: ok"
