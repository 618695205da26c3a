#!/usr/bin/env bash
# Time of the analytic profile of gpt3-175b (issue 1, acceptance 4: < 1 s).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
best=999
for i in 1 2 3 4 5; do
  s=$(date +%s%N)
  "$bin/ob-profile" --model gpt3-175b --analytic --gpu a100-80gb -b 1,2,4,8 > /dev/null
  e=$(( ($(date +%s%N) - s) / 1000000 ))
  echo "  run $i: $e ms"
  [ "$e" -lt "$best" ] && best=$e
done
echo "# gpt3-175b analytic profile, 4 micro-batch sizes: best of 5 = $best ms (target < 1000 ms)"
