#!/usr/bin/env bash
# ob-launch --rsh slurm under sbatch (issue 12, acceptance 5): a Slurm
# cluster on this machine (tests/lib/slurm.sh: slurmctld, three slurmd
# nodes in network namespaces); a batch job of 3 nodes runs ob-launch with
# no hosts file (the allocation's node list) and --rsh slurm, so each
# agent is an `srun --overlap` step on its node. Once training reaches
# step 15 of 60, the step of one node's agent is cancelled (scancel
# JOB.STEP): the master recovers in place (generation 2, from snapshots)
# and finishes with exit 0, its losses those of the uninterrupted
# one-worker run within 1e-4. After the job no step and no process of it
# is left; ob-launch warned at start that Slurm would end the job on a
# node failure (no --no-kill). Outside an allocation --rsh slurm exits 64 with one line.
# Skipped (77) without root or without Slurm (apt-get install slurm-wlm).
NAME=launch_slurm
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/slurm.sh"
slurm_require
command -v python3 >/dev/null || skip "no python3"
trap 'slurm_down; cleanup' EXIT   # the daemons first: their pid files are in \$WORK

slurm_job_setup 60

# Outside an allocation.
env -u SLURM_JOB_ID "$OB_BIN/ob-launch" --rsh slurm --secret-file "$WORK/secret" --run-dir "$WORK/out" \
  "$WORK/plan.pb" 2> "$WORK/out.err"
rc=$?
[ "$rc" = 64 ] && [ "$(grep -c . "$WORK/out.err")" = 1 ] && grep -q "SLURM_JOB_ID is not set" "$WORK/out.err" \
  || fail "--rsh slurm outside an allocation: exit $rc: $(cat "$WORK/out.err")"

slurm_up "$WORK/slurm" "${NODES[@]}"
slurm_submit "" --steps 60
job=$JOB
at_step() { [ "$(max_step "$WORK/slurm.pb")" -ge 15 ] || ! timeout 5 squeue -h -j "$job" | grep -q .; }
wait_for 90 at_step || fail "no step 15 in 90 s: $(tail -5 "$WORK/job.out")"
timeout 5 squeue -h -j "$job" | grep -q . || fail "the job ended before step 15: $(tail -5 "$WORK/job.out")"
# The agent step on the third node: cancelled as an operator (or a node's
# failure) would.
step=$(timeout 5 squeue -h -s -j "$job" -o "%i %N" | awk -v n="${NODES[2]}" '$2 == n && $1 !~ /batch/ {print $1; exit}')
[ -n "$step" ] || fail "no agent step on ${NODES[2]}: $(timeout 5 squeue -s -j "$job")"
steps_before=$(timeout 5 squeue -h -s -j "$job" | wc -l)
timeout 10 scancel "$step" || fail "scancel $step"
job_done() { ! timeout 5 squeue -h -j "$job" | grep -q .; }
wait_for 120 job_done || fail "the job did not end in 120 s: $(tail -5 "$WORK/job.out")"
grep -q "decide generation=2 lost hosts ${NODES[2]}" "$WORK/run/events.log" \
  || fail "no recovery decided: $(grep -E 'detect|decide' "$WORK/run/events.log" | head -3; tail -3 "$WORK/job.out")"
grep -q "done exit 0" "$WORK/run/events.log" || fail "the run did not end with exit 0: $(tail -5 "$WORK/job.out")"
rec=$(grep " recovered generation=2 " "$WORK/run/events.log") || fail "no recovered line"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/slurm.pb" 1e-4 > "$WORK/slurm.cmp" \
  || fail "losses: $(cat "$WORK/slurm.cmp")"
! grep -q "kill-agent" "$WORK/run/events.log" || fail "an srun step was SIGKILLed: $(grep kill-agent "$WORK/run/events.log")"
# Submitted without --no-kill: ob-launch said, in one line at its start,
# that Slurm would end the job on a node failure, naming the flag.
[ "$(grep -c -- "submit with sbatch --no-kill" "$WORK/job.out")" = 1 ] \
  || fail "no one-line --no-kill warning: $(head -3 "$WORK/job.out")"
left=$(timeout 5 squeue -h -s 2>/dev/null | grep -c .)
[ "$left" = 0 ] || fail "steps left after the job: $(timeout 5 squeue -s)"
# The cancelled step ended by Slurm; no agent or worker of ours anywhere.
wait_for 5 no_tagged || fail "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: job $job ($steps_before steps), $step cancelled at step >= 15: $(cat "$WORK/slurm.cmp"); ${rec#* recovered }"
echo "$NAME: ok"
