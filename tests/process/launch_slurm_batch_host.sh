#!/usr/bin/env bash
# The batch host of a Slurm job loses power (issue 61, acceptance 2): the
# Slurm cluster of tests/lib/slurm.sh with SlurmdTimeout=10, a batch job of
# 3 nodes with #SBATCH --no-kill running ob-launch --rsh slurm; the master
# is the batch step on node a, its standby master an srun step on node b.
# At step 15 node a loses power (its link down, every process of its
# namespace SIGKILLed: its slurmd, the batch step, the master, a's agent and
# workers). The standby takes over with b and c and trains on from the
# replicas; the run is held at step 30 of the standby's generation until
# Slurm has marked a down, so that Slurm's verdict falls inside the run. It
# ends "done exit 0" in the standby's events.log with every step trained,
# losses those of the uninterrupted one-worker run within 1e-4, and the job
# ends with it (the standby ends the allocation: the batch step is gone):
# no job, step or process is left. Skipped (77) without root or Slurm.
NAME=launch_slurm_batch_host
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/slurm.sh"
slurm_require
command -v python3 >/dev/null || skip "no python3"
trap 'slurm_down; cleanup' EXIT   # the daemons first: their pid files are in \$WORK
STEPS=60

slurm_job_setup "$STEPS"

SLURM_CONF_EXTRA="SlurmdTimeout=10" slurm_up "$WORK/slurm" "${NODES[@]}"
# Every rank waits before step 16 of the first generation, and before step
# 30 of the standby's (generation 2), until $WORK/release exists.
park="0:park=16;1:park=16;2:park=16;0:park=30@2;1:park=30@2;2:park=30@2"
slurm_submit "#SBATCH --no-kill
export OB_INJECT_RELEASE='$WORK/release'" --steps "$STEPS" --inject "$park"
job=$JOB
at_step() { [ "$(max_step "$WORK/slurm.pb")" -ge 15 ] || ! job_running; }
wait_for 90 at_step || fail "no step 15 in 90 s: $(tail -5 "$WORK/job.out")"
job_running || fail "the job ended before step 15: $(tail -5 "$WORK/job.out")"
events="$WORK/run/events.log"
standby_events="$WORK/run/standby-${NODES[1]}/events.log"
grep -q " standby-master host=${NODES[1]} address=" "$events" \
  || fail "no standby master on ${NODES[1]}: $(grep standby "$events" | tr '\n' '|') $(tail -3 "$WORK/job.out")"
batch=$(timeout 5 squeue -h -j "$job" -o %B)
[ "$batch" = "${NODES[0]}" ] || fail "the batch host is '$batch', not ${NODES[0]}"

slurm_power_off "${NODES[0]}"
killed_ms=$(now_ms)
took() { grep -q " takeover term=2 lost_master=${NODES[0]} " "$standby_events" 2>/dev/null; }
wait_for 60 took || fail "no takeover in 60 s: $(grep -E 'leader-lost|takeover' "$standby_events" | tr '\n' '|') $(tail -5 "$WORK/job.out")"
resumed() { grep -q " recovered generation=2 " "$standby_events" 2>/dev/null; }
wait_for 60 resumed || fail "no step under the standby in 60 s: $(tail -5 "$WORK/job.out")"
resumed_ms=$(( $(now_ms) - killed_ms ))
node_down() { timeout 5 sinfo -h -n "${NODES[0]}" -o %T | grep -q '^down'; }
wait_for 90 node_down || fail "Slurm did not mark ${NODES[0]} down in 90 s: $(timeout 5 sinfo -N 2>&1 | tr '\n' '|')"
slurm_ms=$(( $(now_ms) - killed_ms ))
touch "$WORK/release"

ended() { grep -q " done " "$standby_events" 2>/dev/null; }
wait_for 120 ended || fail "the run did not end under the standby: $(tail -5 "$WORK/job.out")"
grep -q " done exit 0$" "$standby_events" || fail "$(grep " done " "$standby_events")"
gone() { ! job_running; }
wait_for 60 gone || fail "job $job still holds its nodes 60 s after the run: $(timeout 5 squeue -j "$job" 2>&1 | tr '\n' '|')"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/slurm.pb" 1e-4 > "$WORK/slurm.cmp" \
  || fail "losses: $(cat "$WORK/slurm.cmp")"
last=$(max_step "$WORK/slurm.pb")
[ "$last" = $((STEPS - 1)) ] || fail "the last step trained is $last, not $((STEPS - 1))"
left=$(timeout 5 squeue -h -s 2>/dev/null | grep -c .)
[ "$left" = 0 ] || fail "steps left after the job: $(timeout 5 squeue -s)"
wait_for 10 no_tagged || fail "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"
state=$(timeout 5 scontrol show job "$job" 2>/dev/null | tr ' ' '\n' | grep -E '^JobState=' | head -1)
echo "$NAME: job $job, batch host ${NODES[0]} powered off at step 15: the next step $resumed_ms ms later, down in Slurm $slurm_ms ms later, ${state:-job gone}: $(cat "$WORK/slurm.cmp"); $(grep " takeover " "$standby_events" | cut -d' ' -f4-)"
echo "$NAME: ok"
