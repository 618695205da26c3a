#!/usr/bin/env bash
# Steps/s with and without --ckpt-every 10 (issue 5, acceptance 6): a GPT of
# 6 layers × 384 wide (byte vocabulary; ~11 M parameters, ~130 MB of state
# with the AdamW moments) on 4 local hosts in 2 pipelines of 2 stages,
# ROUNDS alternating runs of STEPS steps each; the median of ob-launch's
# closing tokens/s. Checkpoints go to the work directory (same disk as /tmp).
#
#   bench/ckpt_overhead.sh [STEPS] [ROUNDS]     (default 60 3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
steps=${1:-60}
rounds=${2:-3}
bench_cluster ckpt-overhead ovh
cp "$root/bench/gpt-6x384.yaml" model.yaml
"$bin/ob-profile" --model model.yaml --analytic --gpu h100 --dtype float32 --seq-len 128 -q -o p.pb
"$bin/ob-plan" --hosts hosts.txt -g 1 -f 1 -B 8 --gpu-memory 0.2 --overhead-gib 0 -o plan.pb p.pb
run() {  # run NAME [FLAGS...]: prints tokens/s
  local name=$1; shift
  rm -rf "run-$name" ckpt
  "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" --data "$root/tests/data/corpus.txt" \
    --run-dir "run-$name" "$@" plan.pb hosts.txt 2> "$name.err" || { tail -3 "$name.err" >&2; exit 1; }
  closing_tokens "$name.err"
}
plain=() ckpt=()
for ((r = 0; r < rounds; r++)); do
  plain+=("$(run plain)")
  ckpt+=("$(run ckpt --ckpt-dir ckpt --ckpt-every 10)")
  saved=$(grep -c " checkpoint step=" run-ckpt/events.log || true)
  echo "round $r: plain ${plain[-1]} tokens/s, --ckpt-every 10 ${ckpt[-1]} tokens/s ($saved checkpoints)"
done
p=$(median "${plain[@]}"); c=$(median "${ckpt[@]}")
du -sh ckpt/step-* 2>/dev/null | tail -1 | sed 's/^/one checkpoint: /'
awk -v p="$p" -v c="$c" 'BEGIN { printf "median: plain %d, --ckpt-every 10 %d tokens/s: overhead %.1f%% (target <= 3%%)\n", p, c, 100 * (1 - c / p) }'
