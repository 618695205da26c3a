#!/usr/bin/env bash
# Planning the Llama family at scale (issue 55, acceptance 5: each < 1 s):
# ob-profile --analytic | ob-plan for llama3.1-70b on 64 nodes of 8 H100s
# with f = 2, and llama3.1-405b on 1,024 nodes; best of 3 wall-clock
# times of the whole pipe. tests/cli/profile_llama.sh checks the plans'
# memory and the FLOPs formula.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_paths
for spec in "llama3.1-70b 64" "llama3.1-405b 1024"; do
  set -- $spec
  best=999999
  for i in 1 2 3; do
    s=$(date +%s%N)
    "$bin/ob-profile" --model "$1" --analytic --gpu h100 | "$bin/ob-plan" -f 2 --nodes "$2" -g 8 -B 512 > /dev/null
    e=$(( ($(date +%s%N) - s) / 1000000 ))
    [ "$e" -lt "$best" ] && best=$e
  done
  echo "# $1 on $2 nodes x 8 H100, f = 2, global batch 512: profile | plan best of 3 = $best ms (target < 1000 ms)"
done
