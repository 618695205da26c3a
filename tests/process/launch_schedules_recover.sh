#!/usr/bin/env bash
# Recovery under every schedule (issue 68, acceptance 1): gpt-tiny, 2
# pipelines x 2 stages (4 local hosts), f = 1, fp32. Under 1f1b, zb-h1,
# zb-h2, interleaved and zb-v (2 chunks a stage: the survivors' snapshots
# hold several layer ranges), kill -9 of host h2 at step 15 (every worker parked before step 17,
# so the run is still going on any machine): recovered in place from the
# replicas' snapshots, the new generation's workers run the schedule of
# the template they were given, and every loss is the uninterrupted run's
# of the same schedule within 1e-6 relative.
NAME=launch_schedules_recover
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
STEPS=30

"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -b 1 -q \
  -o "$WORK/tiny.pb" || fail "ob-profile"
export OB_INJECT_RELEASE="$WORK/release"
for sched in 1f1b zb-h1 zb-h2 interleaved zb-v; do
  plan_hosts "p-$sched" h1 h2 h3 h4 -- -g 1 -f 1 --pipelines 2,2 --gpu-memory 0.1 --schedule "$sched"
  export RUN_PLAN="$WORK/p-$sched.pb" RUN_HOSTS="$WORK/p-$sched.hosts"
  reference_run "$STEPS"
  run_start "kill-$sched" "$STEPS" --inject "0:park=17;1:park=17;2:park=17;3:park=17"
  kill_host_at "kill-$sched" 15 "${TAG}h2"
  check_recovered "kill-$sched" "$STEPS" "kill -9 of ${TAG}h2 under $sched"
  python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/kill-$sched.pb" 1e-6 > "$WORK/kill-$sched.cmp" \
    || fail "$sched: $(cat "$WORK/kill-$sched.cmp")"
  # Generation 2's workers run a template of the plan, under its schedule.
  grep -q "generation 2: pipeline .* schedule $sched" "$WORK/kill-$sched.err" \
    || fail "$sched: no worker of generation 2 runs $sched: $(grep -m1 "generation 2: pipeline" "$WORK/kill-$sched.err")"
  echo "$NAME: kill -9 of ${TAG}h2 at step 15 under $sched: $(cat "$WORK/kill-$sched.cmp")"
  rm -f "$WORK/release"
done
echo "$NAME: ok"
