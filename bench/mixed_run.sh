#!/usr/bin/env bash
# A template that mixes stage degrees against the best one-degree template,
# measured (issue 14, the fourth known error of ob-plan's model): the local
# cluster of 2 hosts x 2 slots, one pipeline over both (--pipelines 2),
# gpt-4x128-v8k (gpt-tiny's blocks under a vocabulary of 8,192, whose LM head
# costs about what the four blocks do), global batch 16 in micro-batches of 1,
# one intra-op thread a worker. Each round profiles the model at the
# cluster's concurrency (4 workers on this machine's cores), plans it with
# --local twice — one degree (ob-plan's default) and --always-mixed (the
# mixed templates kept whatever the plan's prediction) — prints what plain
# --mixed-stages would decide, and trains both plans STEPS steps, the two
# runs back to back in alternating order. Prints each round's predictions
# and measurements (rank 0's wall clock per step after step 5) and the
# medians over the rounds: measured one-degree / mixed (> 1: mixing is
# faster), and each plan's measured / predicted. Exits 0 whatever the
# numbers (a bench, not a test).
#
#   bench/mixed_run.sh [ROUNDS] [STEPS]        (default 3 40)
set -euo pipefail
rounds=${1:-3}
steps=${2:-40}
source "$(dirname "$0")/lib.sh"
tag="mixrun$$x"
bench_workdir mixed-run "--host ${tag}"
metrics_py=$root/tests/lib/metrics.py
bench_secret
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
printf '%s slots=2\n' "${tag}0" "${tag}1" > hosts.txt

gains=() ratio_u=() ratio_m=()
for ((r = 0; r < rounds; r++)); do
  "$bin/ob-profile" --model "$root/bench/gpt-4x128-v8k.yaml" --threads 1 --concurrency 4 -k 50 -q -o profile.pb
  declare -A pred meas
  for kind in uniform mixed; do
    extra=()
    [ "$kind" = mixed ] && extra=(--always-mixed)
    "$bin/ob-plan" -q --local --hosts hosts.txt -f 0 --pipelines 2 -B 16 -b 1 "${extra[@]}" -o "$kind.pb" profile.pb
    "$bin/ob-plan" --explain "$kind.pb" > "$kind.explain"
    pred[$kind]=$(sed -n 's/^# predicted iteration \([0-9.]*\) s.*/\1/p' "$kind.explain")
    echo "round $r $kind: $(grep -A3 '^# nodes stages' "$kind.explain" | grep '  \*$' | sed 's/  */ /g')"
  done
  "$bin/ob-plan" --local --hosts hosts.txt -f 0 --pipelines 2 -B 16 -b 1 --mixed-stages -o decided.pb profile.pb 2>&1 \
    | sed "s/^/round $r: /"
  order=(uniform mixed)
  [ $((r % 2)) = 1 ] && order=(mixed uniform)
  for kind in "${order[@]}"; do
    rm -rf "run-$kind"
    timeout 300 "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" \
      --data "$root/README.md" --run-dir "run-$kind" --metrics "$kind.m" \
      "$kind.pb" hosts.txt 2> "$kind.err" || { tail -3 "$kind.err" >&2; exit 1; }
    meas[$kind]=$(python3 "$metrics_py" wall-step "$kind.m" 5)
  done
  g=$(awk -v u="${meas[uniform]}" -v m="${meas[mixed]}" 'BEGIN { printf "%.3f", u / m }')
  ru=$(awk -v m="${meas[uniform]}" -v p="${pred[uniform]}" 'BEGIN { printf "%.3f", m / p }')
  rm_=$(awk -v m="${meas[mixed]}" -v p="${pred[mixed]}" 'BEGIN { printf "%.3f", m / p }')
  echo "round $r: one degree predicted ${pred[uniform]} s measured ${meas[uniform]} s ($ru); mixed predicted ${pred[mixed]} s measured ${meas[mixed]} s ($rm_); one degree / mixed $g"
  gains+=("$g") ratio_u+=("$ru") ratio_m+=("$rm_")
done
echo
echo "medians over $rounds rounds: measured one degree / mixed $(median "${gains[@]}"); measured / predicted: one degree $(median "${ratio_u[@]}"), mixed $(median "${ratio_m[@]}")"
