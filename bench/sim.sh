#!/usr/bin/env bash
# ob-sim at scale (issue 14): gpt3-175b, analytic H100 profile, 8 GPUs a
# node, global batch 1536, f chosen by ob-plan -f auto from the failure rate;
# 30 simulated days of drawn failures (exponential, seed 1), nodes out 2 h.
# Failure rates from Meta's published job-level mean time to failure (7.9 h
# at 1,024 GPUs, 1.8 h at 16,384) as a per-node MTBF = nodes x job MTTF;
# 4,096 GPUs at the 1,024-GPU figure's per-node rate. Prints, per scale, the
# time ob-plan and ob-sim take and ob-sim's report (ob against
# checkpoint-restart), and writes the 16,384-GPU timeline to OUT (default
# docs/ettr-16k.svg).
#
#   bench/sim.sh [OUT]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
out=${1:-$root/docs/ettr-16k.svg}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/ob-profile" --model gpt3-175b --analytic --gpu h100 -o "$tmp/g3.pb"
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
for cfg in "128 42.1d 1024" "512 42.1d 4096" "2048 153.6d 16384"; do
  set -- $cfg
  nodes=$1 mtbf=$2 gpus=$3
  echo "## $gpus GPUs ($nodes nodes), node MTBF $mtbf, repair 2h, 30 days"
  s=$(date +%s%N)
  "$bin/ob-plan" -q -f auto --node-mtbf "$mtbf" --repair-time 2h --nodes "$nodes" -g 8 -B 1536 \
    -o "$tmp/plan.pb" "$tmp/g3.pb"
  echo "# ob-plan -f auto: $(ms "$s") ms"
  svg=()
  [ "$gpus" = 16384 ] && svg=(--svg "$out")
  s=$(date +%s%N)
  "$bin/ob-sim" --node-mtbf "$mtbf" --repair-time 2h --horizon 30d "${svg[@]}" "$tmp/plan.pb"
  echo "# ob-sim: $(ms "$s") ms"
  echo
done
