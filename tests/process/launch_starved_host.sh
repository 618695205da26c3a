#!/usr/bin/env bash
# Slow is not dead (issue 54): a starved host. 4 local hosts in 2 pipelines
# of 2 stages, gpt-tiny on the fixed corpus.
#  1. Host h2's agent, seed and worker are held to 15% of one core (a CPU
#     cgroup: v1's cpu.cfs_quota_us 15000 of cpu.cfs_period_us 100000, v2's
#     cpu.max "15000 100000"; a SIGSTOP/SIGCONT duty cycle where neither
#     can be made: the test says which ran) for 20 s from step 10. Its
#     worker is slow, the three others wait for it: no worker is killed, no
#     generation torn down, nothing detected, and every loss equals an
#     uninterrupted run's within 1e-4. The run is parked at step PARK (every
#     rank, --inject park) until the throttle is lifted, so training is
#     still going for the whole 20 s on any machine.
#  2. Host h2's worker alone held to 0.1% of a core (1 ms every second),
#     its forwards and backwards made 10 times as costly in CPU (--inject
#     spin=10: gpt-tiny's are a millisecond, which 0.1% still runs about
#     once a second): a stall in all but name. Found as a hang within its
#     derived deadline + 2 s of the real stall (the deadline the master
#     states in its worker-hang line), naming that rank and host, and
#     recovered in place: exit 0, losses equal. The real stall begins when
#     the last counter stops, not at the throttle: in its first 1 ms slices
#     the throttled worker still finishes a receive or a send, and the
#     peer it sends to moves after it (on a slow machine, seconds after the
#     throttle). So the test takes the master's still_ms (how long every
#     counter has been still when it found the hang) and checks it against
#     its own clock: no longer than the throttle has lasted, and begun
#     within one deadline of the throttle (else the throttle stalled
#     nothing). (STARVED_ONLY_STALL=1 runs this case alone.)
NAME=launch_starved_host
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/cgroup.sh"
command -v python3 >/dev/null || skip "no python3"
trap 'cg_cleanup; cleanup' EXIT
make_two_by_two
export OB_INJECT_RELEASE="$WORK/release"
STEPS=60 PARK=50 AT=10 STARVE_S=20
park_all="0:park=$PARK;1:park=$PARK;2:park=$PARK;3:park=$PARK"
reference_run "$STEPS"
h2="${TAG}h2"

# --- 1. 15% of a core for 20 s: slow, not dead ------------------------------------
if [ -z "${STARVED_ONLY_STALL:-}" ]; then
rm -f "$WORK/release"
run_start starve "$STEPS" --inject "$park_all"
wait_step starve "$AT" || fail "starve: no step $AT: $(tail -3 "$WORK/starve.err")"
# shellcheck disable=SC2046
CG_KIND=""
cg_throttle starve 15000 100000 $(host_pids "$h2")
kind=$CG_KIND
[ -n "$kind" ] || fail "starve: no throttle"
at=$(max_step "$WORK/starve.pb")
sleep "$STARVE_S"
during=$(( $(max_step "$WORK/starve.pb") - at ))
cg_release starve
touch "$WORK/release"
run_wait
[ "$RC" = 0 ] || fail "starve: exit $RC: $(grep -E ' (detect|decide) ' "$WORK/starve/events.log" | head -3)"
! grep -E ' (detect|worker-hang|decide|suspect) ' "$WORK/starve/events.log" \
  || fail "starve: a host held to 15% of a core for ${STARVE_S} s was taken for failed (above)"
! grep -q "killed" "$WORK/starve.err" || fail "starve: a worker was killed: $(grep -m3 killed "$WORK/starve.err")"
[ "$(grep -c ' start-workers ' "$WORK/starve/events.log")" = 1 ] \
  || fail "starve: more than one generation: $(grep ' start-workers ' "$WORK/starve/events.log")"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/starve.pb" 1e-4 > "$WORK/starve.cmp" \
  || fail "starve: $(cat "$WORK/starve.cmp")"
wait_for 5 no_tagged || fail "starve: processes left behind: $(tagged)"
echo "$NAME: $h2 at 15% of a core ($kind) for ${STARVE_S} s from step $at: $during steps trained meanwhile," \
  "no detection, one generation; $(cat "$WORK/starve.cmp")"
fi

# --- 2. 0.1% of a core: a stall in all but name, found ------------------------------
rm -f "$WORK/release"
# h2's rank: ranks go pipeline by pipeline, stage by stage.
victim=$(python3 - "$WORK/plan.json" "$h2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["instantiation"]["pipelines"]
ranks = [n for q in p for n in q["nodes"]]
print(ranks.index(sys.argv[2]))
PY
) || fail "stall: no rank on $h2 in the plan"
run_start stall "$STEPS" --inject "$park_all;$victim:spin=10"
wait_step stall "$AT" || fail "stall: no step $AT: $(tail -3 "$WORK/stall.err")"
grep -qsa "OB_HOST=$h2" "/proc/$(worker_pid "$victim")/environ" || fail "stall: rank $victim is not on $h2"
CG_KIND=""
cg_throttle stall 1000 1000000 "$(worker_pid "$victim")"
kind=$CG_KIND
[ -n "$kind" ] || fail "stall: no throttle"
t0=$(now_ms)
found() { grep -q " detect worker rank $victim on host $h2 hung: " "$WORK/stall/events.log"; }
wait_for 120 found || fail "stall: rank $victim on $h2 at 0.1% of a core was not found hung in 120 s:" \
  "$(grep -E ' (detect|decide) ' "$WORK/stall/events.log" | head -3)"
t1=$(now_ms)
cg_release stall
touch "$WORK/release"
hang=$(grep -m1 " worker-hang rank=$victim host=$h2 " "$WORK/stall/events.log") \
  || fail "stall: no worker-hang line for rank $victim: $(grep worker-hang "$WORK/stall/events.log")"
[[ "$hang" =~ deadline_ms=([0-9]+)\ still_ms=([0-9]+) ]] || fail "stall: no deadline or still_ms in: $hang"
deadline=${BASH_REMATCH[1]} still=${BASH_REMATCH[2]}
# still_ms by the test's clock: the stall began after the throttle (250 ms:
# the test's poll of events.log) and within one deadline of it.
[ "$still" -le $((t1 - t0 + 250)) ] \
  || fail "stall: the master says every counter was still for $still ms, longer than the throttle's $((t1 - t0)) ms: $hang"
[ $((t1 - t0 - still)) -le "$deadline" ] \
  || fail "stall: the job still moved $((t1 - t0 - still)) ms into the throttle, more than its deadline ($deadline ms): $hang"
[ "$still" -le $((deadline + 2000)) ] \
  || fail "stall: found $still ms into the real stall, past its deadline ($deadline ms) + 2 s: $hang"
run_wait
RC=$RC check_recovered stall "$STEPS" "rank $victim on $h2 held to 0.1% of a core ($kind)"
echo "$NAME: stall: every counter still from $((t1 - t0 - still)) ms after the throttle; found $still ms into that" \
  "(deadline $deadline ms), $((t1 - t0)) ms after the throttle: $(grep -m1 -o "worker rank $victim on host $h2 hung: [^;]*" "$WORK/stall/events.log")"
# Every throttle released and its cgroup gone.
for d in "${CG_DIRS[@]}"; do [ ! -d "$d" ] || fail "cgroup $d left behind"; done
echo "$NAME: ok"
