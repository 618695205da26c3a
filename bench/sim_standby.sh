#!/usr/bin/env bash
# What the standby master is worth (issue 61, acceptance 5): ob-sim with
# and without it (--standby-master on|off) for a 16-node and a 1,024-node
# job: gpt3-175b, analytic H100 profile, 8 GPUs a node, global batch 1536,
# f from ob-plan -f auto (with the same setting; at 16 nodes it is 0, where
# every failure restarts anyway, so f = 1 is shown too); nodes fail with a per-node
# MTBF of 42.1 d (Meta's published 7.9 h job MTTF at 1,024 GPUs, as in
# bench/sim.sh) and are out 2 h; 30 days, seeds 1..SEEDS. Prints, per scale
# and setting, the mean ETTR, the master's host's failures and the restarts
# from a checkpoint over the seeds.
#
#   bench/sim_standby.sh [SEEDS]     (default 5)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
seeds=${1:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/ob-profile" --model gpt3-175b --analytic --gpu h100 -o "$tmp/g3.pb"
mtbf=42.1d
printf '%-6s %-8s %3s %10s %16s %9s\n' nodes standby f ETTR master_failures restarts
for cfg in "16 auto" "16 1" "1024 auto"; do
  set -- $cfg
  nodes=$1 f=$2
  for sm in on off; do
    "$bin/ob-plan" -q -f "$f" --node-mtbf "$mtbf" --repair-time 2h --standby-master "$sm" --nodes "$nodes" \
      -g 8 -B 1536 -o "$tmp/plan.pb" "$tmp/g3.pb"
    for seed in $(seq 1 "$seeds"); do
      "$bin/ob-sim" -q --json --policy ob --node-mtbf "$mtbf" --repair-time 2h --horizon 30d --seed "$seed" \
        --standby-master "$sm" "$tmp/plan.pb" > "$tmp/run-$seed.json"
    done
    python3 - "$nodes" "$sm" "$tmp" "$seeds" <<'PY'
import json, sys
nodes, sm, tmp, seeds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runs = [json.load(open(f"{tmp}/run-{s}.json"))["results"][0] for s in range(1, seeds + 1)]
mean = lambda k: sum(r[k] for r in runs) / len(runs)
print(f"{nodes:<6} {sm:<8} {runs[0]['faults']:>3} {mean('ettr'):>10.5f} {mean('master_failures'):>16.1f} "
      f"{mean('checkpoint_restarts'):>9.1f}")
PY
  done
done
