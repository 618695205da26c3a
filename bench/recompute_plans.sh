#!/usr/bin/env bash
# Plans that recomputation shrinks (issue 56, acceptance 3): analytic H100
# profiles of gpt3-175b (sequence 2048) and llama3.1-70b (sequence 8192),
# planned for 1,024 nodes of 8 GPUs with -f auto --node-mtbf 30d and a
# global batch of 1,536 sequences, with --recompute none and auto: n0, the
# templates the instantiation uses (node counts x pipelines), the
# predicted iteration and the f chosen; then the wall-clock time of
# ob-plan -f auto for 2,048 nodes x 8 (best of 3; target < 1 s).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
work=$(mktemp -d /tmp/ob-recompute-plans.XXXXXX)
trap 'rm -rf "$work"' EXIT
for spec in "gpt3-175b 2048" "llama3.1-70b 8192"; do
  set -- $spec
  "$bin/ob-profile" --model "$1" --analytic --gpu h100 --seq-len "$2" -q -o "$work/$1.pb"
  for mode in none auto; do
    "$bin/ob-plan" -q -f auto --node-mtbf 30d --nodes 1024 -g 8 -B 1536 --recompute "$mode" \
      -o "$work/$1-$mode.pb" "$work/$1.pb"
    "$bin/ob-plan" --json "$work/$1-$mode.pb" > "$work/$1-$mode.json"
    python3 - "$work/$1-$mode.json" "$1" "$2" "$mode" <<'PY'
import collections, json, sys
p = json.load(open(sys.argv[1]))
inst = p["instantiation"]
used = collections.Counter(x["template_nodes"] for x in inst["pipelines"])
t = {x["nodes"]: x for x in p["templates"]}
modes = collections.Counter(s.get("recompute", "RECOMPUTE_NONE").split("_")[1].lower()
                            for n in used for s in t[n]["stages"])
print(f"{sys.argv[2]} seq {sys.argv[3]} --recompute {sys.argv[4]}: n0 {p['min_nodes']}, f {p.get('faults', 0)}, "
      f"pipelines {sum(used.values())} on templates {dict(sorted(used.items()))}, "
      f"stage modes in use {dict(modes)}, predicted iteration {inst['iteration_seconds']:.4f} s")
PY
  done
done
"$bin/ob-profile" --model gpt3-175b --analytic --gpu h100 -q -o "$work/big.pb"
best=999999
for i in 1 2 3; do
  s=$(date +%s%N)
  "$bin/ob-plan" -q -f auto --node-mtbf 30d --nodes 2048 -g 8 -B 1536 -o "$work/big-plan.pb" "$work/big.pb"
  e=$(( ($(date +%s%N) - s) / 1000000 ))
  [ "$e" -lt "$best" ] && best=$e
done
echo "gpt3-175b on 2048 nodes x 8, -f auto --recompute auto: ob-plan best of 3 = $best ms (target < 1000 ms)"
