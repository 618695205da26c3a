#!/usr/bin/env bash
# Exposed data-parallel all-reduce time per step, with and without the
# overlap of issue 13 (acceptance 3). A GPT of 6 layers × 384 wide (byte
# vocabulary, ~11 M parameters: ~22 MB of fp32 gradients per stage),
# global batch 32 in micro-batches of 4 sequences of 128 tokens, on a CPU
# cluster of 4 hosts — network namespaces on a bridge, each link shaped
# to RATE by tbf both ways, so that gradients take network time as they do
# between nodes — in 2 pipelines of 2 stages; ROUNDS alternating runs of
# STEPS steps. The exposed time is the metrics stream's
# allreduce_exposed_seconds (field 40): the wait for the gradient
# all-reduces after the last backward, averaged over every rank and every
# step but the first two. OB_OVERLAP=0 makes the workers issue every
# all-reduce after the pipeline schedule, as before issue 13. The losses of
# both runs must agree within 1e-6 relative. Every worker runs one thread
# (OpenMP and the BLAS pinned: the four hosts share this machine's cores,
# and each agent, seeing them all, would size the pools for itself). Needs
# root.
#
# The overlap can hide at most one micro-batch's backward per step (the
# gradients are final only after the last one), so what it saves depends
# on how the all-reduce compares with that backward: RATE sets it.
#
#   bench/overlap.sh [STEPS] [ROUNDS] [RATE]     (default 12 3 1gbit)
set -euo pipefail
steps=${1:-12}
rounds=${2:-3}
rate=${3:-1gbit}
source "$(dirname "$0")/lib.sh"
bench_paths
OB_BIN=$bin
OB_SOURCE_DIR=$root
skip() { echo "overlap: skipped: $*" >&2; exit 77; }
fail() { echo "overlap: FAIL: $*" >&2; exit 1; }
source "$root/tests/lib/netns.sh"
netns_require tc
WORK=$(mktemp -d /tmp/ob-overlap.XXXXXX)
trap 'netns_cleanup || true; rm -rf "$WORK"' EXIT
cd "$WORK"
metrics_py=$root/tests/lib/metrics.py
tag="ovl$$"
hosts=("${tag}a" "${tag}b" "${tag}c" "${tag}d")
printf '%s\n' "${hosts[@]}" > hosts.txt
bench_secret
cp "$root/bench/gpt-6x384.yaml" model.yaml
"$bin/ob-profile" --model model.yaml --analytic --gpu h100 --dtype float32 --seq-len 128 -b 4 -q -o p.pb
"$bin/ob-plan" --hosts hosts.txt -g 1 -f 1 -B 32 -b 4 --gpu-memory 0.2 --overhead-gib 0 -o plan.pb p.pb
"$bin/ob-plan" --explain plan.pb 2>&1 | grep -i "pipeline" | head -3
netns_add "${hosts[@]}"
netns_star_ready "${hosts[@]}"
for h in "${hosts[@]}"; do
  tc qdisc add dev "${NETNS_HOSTDEV[$h]}" root tbf rate "$rate" burst 256kb latency 100ms
  ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
done
netns_rsh "$WORK/rsh"
run() {  # run NAME OVERLAP: prints the mean exposed all-reduce seconds
  local name=$1
  rm -rf "run-$name"
  OB_OVERLAP=$2 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout 600 "$bin/ob-launch" --rsh "$WORK/rsh" \
    --bind "$NETNS_GATEWAY" --secret-file secret --steps "$steps" \
    --data "$root/tests/data/corpus.txt" --run-dir "run-$name" --metrics "$name.metrics" \
    plan.pb hosts.txt 2> "$name.err" || { tail -3 "$name.err" >&2; exit 1; }
  python3 "$metrics_py" mean "$name.metrics" 40 2 by-rank 2> "$name.ranks"
}
off=() on=() tok_off=() tok_on=()
for ((r = 0; r < rounds; r++)); do
  off+=("$(run off 0)"); tok_off+=("$(closing_tokens off.err)")
  on+=("$(run on 1)"); tok_on+=("$(closing_tokens on.err)")
  same=$(python3 "$metrics_py" compare off.metrics on.metrics 1e-6)
  echo "round $r: exposed all-reduce per step: without overlap ${off[-1]} s (${tok_off[-1]} tokens/s), with ${on[-1]} s (${tok_on[-1]} tokens/s); $same"
  echo "  per rank, without / with: $(paste -d/ off.ranks on.ranks | sed 's/  rank [0-9]*: //2' | tr -s ' ' | paste -sd';')"
done
a=$(median "${off[@]}"); b=$(median "${on[@]}")
awk -v a="$a" -v b="$b" -v ta="$(median "${tok_off[@]}")" -v tb="$(median "${tok_on[@]}")" \
  'BEGIN { printf "median exposed all-reduce per step: without overlap %.4f s, with %.4f s: %.0f%% less (target >= 40%%); tokens/s %d -> %d\n", a, b, 100 * (1 - b / a), ta, tb }'
