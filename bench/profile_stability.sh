#!/usr/bin/env bash
# Stability of measured layer times (issue 1, acceptance 6): two back-to-back
# ob-profile runs on an idle machine; per layer, the relative difference of the
# median forward (and backward) times. Target: every layer's forward < 15%.
#
#   bench/profile_stability.sh [MODEL] [extra ob-profile flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
model=${1:-gpt2}; shift || true
flags=(--model "$model" --device cpu --seq-len 256 --warmup 3 --repeats 9 --allreduce-max 1 "$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for run in 1 2; do
  start=$(date +%s.%N)
  "$bin/ob-profile" "${flags[@]}" -q -o "$tmp/run$run.pb"
  echo "# run $run: $(echo "$(date +%s.%N) - $start" | bc) s" >&2
  "$bin/ob-profile" --json "$tmp/run$run.pb" > "$tmp/run$run.json"
done

python3 - "$tmp/run1.json" "$tmp/run2.json" "${flags[*]}" <<'PY'
import json, statistics, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"# ob-profile stability: two back-to-back runs of: ob-profile {sys.argv[3]}")
print(f"# device: {a['device']['name']}, torch {a['torch_version']}")
print(f"# {'layer':<10} {'fwd run1':>10} {'fwd run2':>10} {'diff':>7} {'bwd run1':>10} {'bwd run2':>10} {'diff':>7}")
print(f"# {'':<10} {'(ms)':>10} {'(ms)':>10} {'(%)':>7} {'(ms)':>10} {'(ms)':>10} {'(%)':>7}")
fd, bd = [], []
for la, lb in zip(a['layers'], b['layers']):
    ca, cb = la['costs'][0], lb['costs'][0]
    f = abs(ca['forward_seconds'] - cb['forward_seconds']) / max(ca['forward_seconds'], cb['forward_seconds'])
    g = abs(ca['backward_seconds'] - cb['backward_seconds']) / max(ca['backward_seconds'], cb['backward_seconds'])
    fd.append(f); bd.append(g)
    print(f"  {la['name']:<10} {ca['forward_seconds']*1e3:>10.3f} {cb['forward_seconds']*1e3:>10.3f} {f*100:>7.1f}"
          f" {ca['backward_seconds']*1e3:>10.3f} {cb['backward_seconds']*1e3:>10.3f} {g*100:>7.1f}")
print(f"# forward difference: median {statistics.median(fd)*100:.1f}%, max {max(fd)*100:.1f}% (target < 15%)")
print(f"# backward difference: median {statistics.median(bd)*100:.1f}%, max {max(bd)*100:.1f}%")
print("# verdict:", "PASS" if max(fd) < 0.15 else "FAIL")
PY
