#!/usr/bin/env bash
# Activation recomputation, predicted against measured (issue 56,
# acceptance 2): for GPT-2-sized blocks (768 wide, 12 heads) and
# Llama-sized ones (1024 wide, 16 heads, 4 kv heads, SwiGLU 2816), 4
# blocks at sequence 512, one pipeline of 2 stages on 2 local hosts
# (stage 0 holds 2 micro-batches in flight), global batch 4 in
# micro-batches of 1, fp32, one intra-op thread a worker. Each model is
# profiled once (measured, under the concurrency of 2 workers: every mode's
# costs), then each mode is planned with ob-plan --local --recompute MODE
# and trained STEPS steps. Memory: the largest peak RSS of the two workers
# (metrics field 45) against the plan's largest stage memory; time: rank 0's
# wall clock per step after step 2 against the predicted iteration. Prints
# one line per model and mode and a table; exits 0 whatever the ratios (a
# bench, not a test).
#
# Peak RSS is the peak of what the process holds from the OS, and glibc
# keeps freed blocks of its heap: with its default, self-raising mmap
# threshold the tensors of one micro-batch are freed into the heap and the
# next ones reuse it, so the peak says little of what was live (selective's
# ~60 MiB showed as 6). The bench fixes the threshold at 1 MiB
# (MALLOC_MMAP_THRESHOLD_, glibc's tunable): every large tensor is mapped
# and unmapped, and the peak RSS follows the live bytes, at the price of
# page faults (steps about twice as long, profile and run alike).
# MALLOC_MMAP_THRESHOLD_= (empty) measures with glibc's default.
#
#   bench/recompute.sh [STEPS]          (default 8)
#   MODELS=gpt2-blocks.yaml MODES="none full" bench/recompute.sh
set -euo pipefail
steps=${1:-8}
source "$(dirname "$0")/lib.sh"
bench_cluster recompute "rc$$x"
bench_need ob-profile ob-plan ob-launch
metrics_py=$root/tests/lib/metrics.py
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_-1048576}
[ -n "$MALLOC_MMAP_THRESHOLD_" ] || unset MALLOC_MMAP_THRESHOLD_
printf 'rc%sx1\nrc%sx2\n' "$$" "$$" > hosts2.txt

cat > gpt2-blocks.yaml <<'EOF'
name: gpt2-blocks
n_layer: 4
n_embd: 768
n_head: 12
n_positions: 512
vocab_size: 256
EOF
cat > llama-blocks.json <<'EOF'
{"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4,
 "intermediate_size": 2816, "num_hidden_layers": 4, "vocab_size": 256, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false}
EOF

table="model mode predicted_s measured_s ratio predicted_MiB rss_MiB ratio"
for model in ${MODELS:-gpt2-blocks.yaml llama-blocks.json}; do
  name=${model%%.*}
  "$bin/ob-profile" --model "$model" --threads 1 --concurrency 2 --seq-len 512 -b 1 -k 3 -q -o "profile-$name.pb"
  for mode in ${MODES:-none selective full}; do
    "$bin/ob-plan" -q --local --hosts hosts2.txt -f 0 --pipelines 2 -B 4 -b 1 --recompute "$mode" \
      -o "plan-$name-$mode.pb" "profile-$name.pb"
    "$bin/ob-plan" --explain "plan-$name-$mode.pb" > "explain-$name-$mode.txt"
    predicted=$(sed -n 's/^# predicted iteration \([0-9.]*\) s.*/\1/p' "explain-$name-$mode.txt")
    predicted_mib=$(sed -n 's/^# predicted peak memory per worker \([0-9.]*\) MiB/\1/p' "explain-$name-$mode.txt")
    rm -rf "run-$name-$mode"
    timeout 600 "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" --standby off \
      --data "$root/tests/data/corpus.txt" --run-dir "run-$name-$mode" --metrics "$name-$mode.m" \
      "plan-$name-$mode.pb" hosts2.txt 2> "$name-$mode.err" || { tail -3 "$name-$mode.err" >&2; exit 1; }
    t=$(python3 "$metrics_py" wall-step "$name-$mode.m" 2)
    rss=$(python3 "$metrics_py" max "$name-$mode.m" 45)
    line=$(awk -v n="$name" -v md="$mode" -v p="$predicted" -v m="$t" -v pm="$predicted_mib" -v r="$rss" \
      'BEGIN { printf "%s %s %.4f %.4f %.2f %.1f %.1f %.2f", n, md, p, m, m / p, pm, r / 1048576, r / 1048576 / pm }')
    echo "$line"
    grep -E '^ +[0-9]+ +[0-9]+ .*(none|selective|full)' "explain-$name-$mode.txt" | sed 's/^/    stage: /'
    table+=$'\n'"$line"
  done
done
echo
column -t <<< "$table"
