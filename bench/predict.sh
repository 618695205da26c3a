#!/usr/bin/env bash
# ob-plan's predictions against ob-launch's measurements (issue 14,
# acceptance 1), on the local cluster: gpt-tiny, global batch 16 in
# micro-batches of 1 (the quick-start's), one intra-op thread per worker,
# in six layouts fixed with ob-plan --pipelines:
#   1x1      one host, one stage
#   4x1      4 pipelines of 1 stage (data parallel)
#   2x2      2 pipelines of 2 stages
#   1x4      one pipeline of 4 stages
#   3+2      a 3-stage and a 2-stage pipeline (5 hosts)
#   2x1-tp2  2 pipelines of one 2-GPU stage, tensor parallel (2 hosts, slots=2)
# (A pipeline of mixed degrees is bench/mixed_run.sh's, against the
# one-degree plan of the same cluster.)
# Each run of a layout is profiled right before it, under the concurrency
# it runs at (ob-profile --concurrency W, W = its workers: they share this
# machine's cores), planned with --local (collectives priced by the
# profile's own all-reduces), and trains STEPS steps; a layout runs RUNS
# times. The measured step time is rank 0's wall clock per step after step
# 5; the table gives the medians of the runs' predictions, of their
# measurements and of their own ratios (measured / predicted); the memory
# is the largest peak RSS of any worker (metrics field 45), against the
# plan's largest stage memory in use. Prints one line per
# layout and a table; exits 0 whatever the ratios (a bench, not a test).
#
#   bench/predict.sh [RUNS] [STEPS]        (default 3 40)
#   LAYOUTS="1x1 2x2" bench/predict.sh      (only those)
set -euo pipefail
runs=${1:-3}
steps=${2:-40}
source "$(dirname "$0")/lib.sh"
tag="pred$$x"
bench_workdir predict "--host ${tag}"
metrics_py=$root/tests/lib/metrics.py
bench_secret
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# name hosts slots faults pipelines model extra-plan-options
layouts=(
  "1x1 1 1 0 1 gpt-tiny"
  "4x1 4 1 3 1,1,1,1 gpt-tiny"
  "2x2 4 1 1 2,2 gpt-tiny"
  "1x4 4 1 0 4 gpt-tiny"
  "3+2 5 1 1 3,2 gpt-tiny"
  "2x1-tp2 2 2 1 1,1 gpt-tiny --tp 2"
)
table="layout workers predicted_s measured_s ratio predicted_MiB rss_MiB ratio"
for spec in "${layouts[@]}"; do
  read -r name hosts slots faults pipelines model extra <<< "$spec"
  if [ -n "${LAYOUTS:-}" ] && [[ " $LAYOUTS " != *" $name "* ]]; then continue; fi
  workers=$((hosts * slots))
  : > "hosts-$name.txt"
  for ((h = 0; h < hosts; h++)); do
    if [ "$slots" -gt 1 ]; then echo "${tag}$h slots=$slots"; else echo "${tag}$h"; fi >> "hosts-$name.txt"
  done
  # Each run is predicted by a profile and plan made right before it: this
  # VM's speed moves by 20-40% within an hour and by 10-20% between two
  # minutes, and a profile made for an earlier run is older than the run it
  # predicts. The ratio kept is the median of the runs' own ratios.
  times=() preds=() ratios=() rss=0
  for ((r = 0; r < runs; r++)); do
    "$bin/ob-profile" --model "$model" --threads 1 --concurrency "$workers" -k 50 -q -o "profile-$name.pb"
    # shellcheck disable=SC2086  # extra is words
    "$bin/ob-plan" -q --local --hosts "hosts-$name.txt" -f "$faults" --pipelines "$pipelines" -B 16 -b 1 \
      $extra -o "plan-$name.pb" "profile-$name.pb"
    "$bin/ob-plan" --explain "plan-$name.pb" > "explain-$name.txt"
    predicted=$(sed -n 's/^# predicted iteration \([0-9.]*\) s.*/\1/p' "explain-$name.txt")
    predicted_mib=$(sed -n 's/^# predicted peak memory per worker \([0-9.]*\) MiB/\1/p' "explain-$name.txt")
    rm -rf "run-$name"
    timeout 300 "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" \
      --data "$root/README.md" --run-dir "run-$name" --metrics "$name.m" \
      "plan-$name.pb" "hosts-$name.txt" 2> "$name.err" || { tail -3 "$name.err" >&2; exit 1; }
    t=$(python3 "$metrics_py" wall-step "$name.m" 5)
    times+=("$t") preds+=("$predicted")
    ratios+=("$(awk -v m="$t" -v p="$predicted" 'BEGIN { printf "%.3f", m / p }')")
    r_rss=$(python3 "$metrics_py" max "$name.m" 45)
    [ "$r_rss" -gt "$rss" ] && rss=$r_rss
  done
  # The last run's stages beside the plan's (ob-plan --explain --measured).
  "$bin/ob-plan" --explain --measured "$name.m" "plan-$name.pb" | sed -n '/^# measured/,$p'
  measured=$(median "${times[@]}")
  predicted=$(median "${preds[@]}")
  ratio=$(median "${ratios[@]}")
  line=$(awk -v n="$name" -v w="$workers" -v p="$predicted" -v m="$measured" -v q="$ratio" -v pm="$predicted_mib" -v r="$rss" \
    'BEGIN { printf "%s %d %.4f %.4f %.2f %.1f %.1f %.2f", n, w, p, m, q, pm, r / 1048576, r / 1048576 / pm }')
  echo "$line   (runs: measured ${times[*]}; predicted ${preds[*]}; ratios ${ratios[*]})"
  table+=$'\n'"$line"
done
echo
column -t <<< "$table"
