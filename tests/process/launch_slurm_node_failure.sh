#!/usr/bin/env bash
# A node of a Slurm job loses power (issue 61, acceptance 1). The Slurm
# cluster of tests/lib/slurm.sh with SlurmdTimeout=10; a batch job of 3
# nodes submitted with #SBATCH --no-kill runs ob-launch --rsh slurm (an
# agent per node as an srun step). At step 15 node c loses power: its link
# goes down and every process of its namespace (its slurmd, the agent's
# step, the workers) is SIGKILLed. ob recovers in place (generation 2);
# the recovered run is held at step 30 (--inject park @2) until Slurm has
# marked node c down, so Slurm's verdict on the job falls inside the run
# whatever this machine's speed (without --no-kill, Slurm ends the job
# there). The job ends with done exit 0, COMPLETED and never requeued,
# every step trained, losses those of the uninterrupted one-worker run
# within 1e-4, and no step or process of it left. ob-launch printed no
# --no-kill warning (launch_slurm.sh checks the warning of a job without
# it). Skipped (77) without root or without Slurm.
NAME=launch_slurm_node_failure
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/slurm.sh"
slurm_require
command -v python3 >/dev/null || skip "no python3"
trap 'slurm_down; cleanup' EXIT   # the daemons first: their pid files are in \$WORK
STEPS=60

slurm_job_setup "$STEPS"

SLURM_CONF_EXTRA="SlurmdTimeout=10" slurm_up "$WORK/slurm" "${NODES[@]}"
# Every rank waits before step 16 of the first generation (so the power
# goes off at step 15 exactly, however fast the run) and before step 30 of
# the second, until $WORK/release exists.
park="0:park=16;1:park=16;2:park=16;0:park=30@2;1:park=30@2;2:park=30@2"
slurm_submit "#SBATCH --no-kill
export OB_INJECT_RELEASE='$WORK/release'" --steps "$STEPS" --inject "$park"
job=$JOB
at_step() { [ "$(max_step "$WORK/slurm.pb")" -ge 15 ] || ! job_running; }
wait_for 90 at_step || fail "no step 15 in 90 s: $(tail -5 "$WORK/job.out")"
job_running || fail "the job ended before step 15: $(tail -5 "$WORK/job.out")"

slurm_power_off "${NODES[2]}"
killed_ms=$(now_ms)
# ob's verdict, then Slurm's: node c down (with --no-kill the job loses
# only c; without it slurmctld ends or requeues the job here).
recovery() { grep -q "decide generation=2 lost hosts ${NODES[2]}" "$WORK/run/events.log" || ! job_running; }
wait_for 60 recovery || fail "no recovery decided in 60 s: $(tail -5 "$WORK/job.out")"
node_down() { timeout 5 sinfo -h -n "${NODES[2]}" -o %T | grep -q '^down'; }
wait_for 90 node_down || fail "Slurm did not mark ${NODES[2]} down in 90 s: $(timeout 5 sinfo -N 2>&1 | tr '\n' '|')"
slurm_ms=$(( $(now_ms) - killed_ms ))
touch "$WORK/release"

# Done: gone from the queue, or no longer running (requeued: pending).
job_done() { ! timeout 5 squeue -h -j "$job" -o %T | grep -q -E 'RUNNING|COMPLETING'; }
wait_for 120 job_done || fail "the job did not end in 120 s: $(tail -5 "$WORK/job.out")"
grep -q "done exit 0" "$WORK/run/events.log" \
  || fail "the run did not end with exit 0: $(grep -E 'detect|decide|done' "$WORK/run/events.log" | tail -3 | tr '\n' '|') $(tail -3 "$WORK/job.out")"
state=$(timeout 5 scontrol show job "$job" | tr ' ' '\n' | grep -E '^(JobState|Restarts|ExitCode)=' | tr '\n' ' ')
case "$state" in
  *JobState=COMPLETED*Restarts=0*ExitCode=0:0*|*JobState=COMPLETED*ExitCode=0:0*Restarts=0*) ;;
  *) fail "job $job: $state (Slurm ended or requeued it)" ;;
esac
rec=$(grep " recovered generation=2 " "$WORK/run/events.log") || fail "no recovered line"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/slurm.pb" 1e-4 > "$WORK/slurm.cmp" \
  || fail "losses: $(cat "$WORK/slurm.cmp")"
last=$(max_step "$WORK/slurm.pb")
[ "$last" = $((STEPS - 1)) ] || fail "the last step trained is $last, not $((STEPS - 1))"
! grep -q -- "--no-kill" "$WORK/job.out" || fail "a --no-kill warning for a job with #SBATCH --no-kill: $(grep -- --no-kill "$WORK/job.out")"
left=$(timeout 5 squeue -h -s 2>/dev/null | grep -c .)
[ "$left" = 0 ] || fail "steps left after the job: $(timeout 5 squeue -s)"
wait_for 5 no_tagged || fail "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: job $job, ${NODES[2]} powered off at step 15, down in Slurm $slurm_ms ms later, job $state: $(cat "$WORK/slurm.cmp"); ${rec#* recovered }"
echo "$NAME: ok"
