#!/usr/bin/env bash
# The training thread's cost of the per-step host snapshot (issue 13,
# acceptance 4): gpt2 (124 M parameters, ~1.5 GB of snapshot per step:
# weights and both AdamW moments) on one local host, one stage, sequence
# length 128, one sequence per step; ROUNDS alternating runs of STEPS steps
# with the snapshot copied in the background (the default) and on the
# training thread (OB_SNAPSHOT_ASYNC=0, as before issue 13). Reports the
# metrics stream's snapshot_seconds (field 41) over step_seconds (field 9),
# both averaged over every step but the first two. The losses of both runs
# must be equal. THREADS (default 1) is the worker's intra-op threads. The
# step times of both are reported too: on the CPU the background copy
# competes with the step for cores and memory bandwidth, which is why
# ob-launch copies on the training thread there unless OB_SNAPSHOT_ASYNC=1.
#
#   bench/snapshot_cost.sh [STEPS] [ROUNDS] [THREADS]     (default 8 2 1)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
steps=${1:-8}
rounds=${2:-2}
threads=${3:-1}
bench_cluster snapshot-cost snp
metrics_py=$root/tests/lib/metrics.py
head -1 hosts.txt > one.txt
"$bin/ob-profile" --model gpt2 --analytic --gpu h100 --dtype float32 --seq-len 128 -q -o p.pb
"$bin/ob-plan" --hosts one.txt -g 1 -f 0 -B 1 --gpu-memory 80 --overhead-gib 0 -o plan.pb p.pb
run() {  # run NAME ASYNC: prints "snapshot_seconds step_seconds"
  local name=$1
  rm -rf "run-$name"
  OMP_NUM_THREADS=$threads OB_SNAPSHOT_ASYNC=$2 "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" \
    --data "$root/tests/data/corpus.txt" --run-dir "run-$name" --metrics "$name.metrics" \
    plan.pb one.txt 2> "$name.err" || { tail -3 "$name.err" >&2; exit 1; }
  echo "$(python3 "$metrics_py" mean "$name.metrics" 41 2) $(python3 "$metrics_py" mean "$name.metrics" 9 2)"
}
sync_share=() async_share=() sync_step=() async_step=()
for ((r = 0; r < rounds; r++)); do
  read -r ss st <<< "$(run sync 0)"
  read -r as at <<< "$(run async 1)"
  same=$(python3 "$metrics_py" compare sync.metrics async.metrics 0)
  sync_share+=("$(awk -v a="$ss" -v b="$st" 'BEGIN { printf "%.4f", a / b }')")
  async_share+=("$(awk -v a="$as" -v b="$at" 'BEGIN { printf "%.4f", a / b }')")
  sync_step+=("$st") async_step+=("$at")
  echo "round $r: on the training thread ${ss} s of ${st} s per step; in the background ${as} s of ${at} s; $same"
done
a=$(median "${sync_share[@]}"); b=$(median "${async_share[@]}")
awk -v a="$a" -v b="$b" -v sa="$(median "${sync_step[@]}")" -v sb="$(median "${async_step[@]}")" -v t="$threads" \
  'BEGIN { printf "median snapshot share of the step (%d intra-op threads): on the training thread %.1f%%, in the background %.1f%% (target <= 5%%); step %.3f s -> %.3f s (%.2fx)\n", t, 100 * a, 100 * b, sa, sb, sb / sa }'
