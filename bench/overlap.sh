#!/usr/bin/env bash
# Exposed data-parallel all-reduce time per step, with and without the
# overlap of issue 13 (acceptance 3): a GPT of 6 layers × 384 wide (byte
# vocabulary, ~11 M parameters: ~44 MB of fp32 gradients per pipeline) on
# 4 local hosts in 2 pipelines of 2 stages; ROUNDS alternating runs of
# STEPS steps each. The exposed time is the metrics stream's
# allreduce_exposed_seconds (field 40): the wait for the gradient
# all-reduces after the last backward, averaged over every rank and every
# step but the first two. OB_OVERLAP=0 makes the workers issue every
# all-reduce after the pipeline schedule, as before issue 13. The losses of
# both runs must agree within 1e-6 relative.
#
#   bench/overlap.sh [STEPS] [ROUNDS]     (default 30 3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
steps=${1:-30}
rounds=${2:-3}
bench_cluster overlap ovl
metrics_py=$root/tests/lib/metrics.py
cat > model.yaml <<'Y'
name: gpt-6x384
n_layer: 6
n_embd: 384
n_head: 6
n_positions: 128
vocab_size: 256
Y
"$bin/ob-profile" --model model.yaml --analytic --gpu h100 --dtype float32 --seq-len 128 -q -o p.pb
"$bin/ob-plan" --hosts hosts.txt -g 1 -f 1 -B 8 --gpu-memory 0.2 --overhead-gib 0 -o plan.pb p.pb
run() {  # run NAME OVERLAP: prints the mean exposed all-reduce seconds
  local name=$1
  rm -rf "run-$name"
  OB_OVERLAP=$2 OMP_NUM_THREADS=1 "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" \
    --data "$root/tests/data/corpus.txt" --run-dir "run-$name" --metrics "$name.metrics" \
    plan.pb hosts.txt 2> "$name.err" || { tail -3 "$name.err" >&2; exit 1; }
  python3 "$metrics_py" mean "$name.metrics" 40 2
}
off=() on=()
for ((r = 0; r < rounds; r++)); do
  off+=("$(run off 0)")
  on+=("$(run on 1)")
  same=$(python3 "$metrics_py" compare off.metrics on.metrics 1e-6)
  echo "round $r: exposed all-reduce per step: without overlap ${off[-1]} s, with ${on[-1]} s; $same"
done
a=$(median "${off[@]}"); b=$(median "${on[@]}")
awk -v a="$a" -v b="$b" 'BEGIN { printf "median exposed all-reduce per step: without overlap %.4f s, with %.4f s: %.0f%% less (target >= 40%%)\n", a, b, 100 * (1 - b / a) }'
