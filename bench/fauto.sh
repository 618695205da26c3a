#!/usr/bin/env bash
# ob-plan -f auto for gpt3-175b (analytic H100 profile, 8 GPUs a node,
# global batch 1,536) at 1,024 and 16,384 GPUs, with node failure rates from
# Meta's published job-level MTTF (7.9 h at 1,024 GPUs, 1.8 h at 16,384:
# node MTBF = nodes × job MTTF), repairs of 2 h; prints the --explain table
# ob-plan chose from and the wall time of the whole ob-plan run, median of 5
# (issue 14: "Scale", ≤ 1 s at 2,048 nodes). Usage: bench/fauto.sh [RUNS]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
runs=${1:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/ob-profile" --model gpt3-175b --analytic --gpu h100 -o "$tmp/g3.pb"
for cfg in "128 42.1d 1024" "2048 153.6d 16384"; do
  set -- $cfg
  nodes=$1 mtbf=$2 gpus=$3
  args=(-f auto --node-mtbf "$mtbf" --repair-time 2h --nodes "$nodes" -g 8 -B 1536)
  echo "## $gpus GPUs ($nodes nodes), node MTBF $mtbf"
  "$bin/ob-plan" -q "${args[@]}" --explain -o "$tmp/plan.pb" "$tmp/g3.pb" | sed -n '/^# -f auto/,/^# ob plan/p' | sed '$d'
  times=()
  for ((i = 0; i < runs; i++)); do
    s=$(date +%s%N)
    "$bin/ob-plan" -q "${args[@]}" -o "$tmp/plan.pb" "$tmp/g3.pb"
    times+=($(( ($(date +%s%N) - s) / 1000000 )))
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
  echo "# ob-plan -f auto, $nodes nodes: median of $runs = $median ms (runs: ${times[*]})"
  echo
done
