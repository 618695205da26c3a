#!/usr/bin/env bash
# Recovery time against the size of the data set (issue 10, acceptance 3):
# the same run (gpt-tiny, 4 local hosts in 2 pipelines of 2 stages, f = 1)
# on a 1 MiB token file and on a 4 GiB one (sparse, in a scratch directory,
# removed after); host 1's agent and worker are killed with SIGKILL at step
# KILL_STEP, and the time from the kill to the next completed step (the
# first `recovered` line of events.log after the kill) is compared.
#
#   bench/data_recovery.sh [RUNS]        (default 3; medians)
#
# Environment: OB_BIN (default build/bin), STEPS (60), KILL_STEP (30),
# BIG_GIB (4).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
TAG=dr$$h
bench_cluster data-recovery "$TAG"
runs=${1:-3}
steps=${STEPS:-60}
kill_step=${KILL_STEP:-30}
big_gib=${BIG_GIB:-4}
bench_need ob-profile ob-plan ob-launch

"$bin/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -o tiny.pb
"$bin/ob-plan" --hosts hosts.txt -g 1 -f 1 -B 8 --gpu-memory 0.012 --overhead-gib 0 -o plan.pb tiny.pb
# uint16 token files (.bin): 1 MiB of ids below gpt-tiny's vocabulary, and a
# sparse file of BIG_GIB GiB (zeros: valid ids; a reader still maps and
# scans every page of it).
python3 -c 'import random, sys; r = random.Random(1); sys.stdout.buffer.write(bytes(r.randrange(256) if i % 2 == 0 else 0 for i in range(1 << 20)))' > small.bin
truncate -s "${big_gib}G" big.bin

# one DATA RUN: prints "kill_to_next_ms start_to_first_ms".
one() {
  local data=$1 run=$2 kill_ms line start first
  kill_ms=$(kill_host_at "$run" "${TAG}1" "$kill_step" "$data") || { echo "- -"; return; }
  line=$(grep ' recovered ' "$run/events.log" | head -1 || true)
  start=$(date -d "$(grep ' start-workers generation=1 ' "$run/events.log" | cut -d' ' -f1)" +%s%3N)
  # the first completed step 0 of any rank (field 8: unix_ms; records() leaves out heartbeats)
  first=$(python3 - "$root/tests/lib" "$run.pb" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import metrics
print(min(r.get(8, 0) for r in metrics.records(sys.argv[2]) if r.get(metrics.STEP, 0) == 0))
PY
  )
  local next=-
  [ -z "$line" ] || next=$(( $(date -d "${line%% *}" +%s%3N) - kill_ms ))
  echo "$next $((first - start))"
}

echo "# recovery vs data size: gpt-tiny, 4 local hosts (2 x 2 stages), SIGKILL of host 1 at step $kill_step"
echo "#   kill->next = the kill to the first 'recovered' line after it; start->first = the first"
echo "#   generation's start-workers to the first completed step (the data opened and checked)"
echo "#   $(nproc) cores; $("$bin/ob-launch" --version); $(date -u +%Y-%m-%d)"
fmt='%-6s %12s %12s %12s %12s\n'
# shellcheck disable=SC2059
printf "$fmt" "# run" "1MiB kill" "1MiB start" "${big_gib}GiB kill" "${big_gib}GiB start"
# shellcheck disable=SC2059
printf "$fmt" "#" "->next(ms)" "->first(ms)" "->next(ms)" "->first(ms)"
small_k=() big_k=() small_f=() big_f=()
for r in $(seq 1 "$runs"); do
  read -r sk sf < <(one small.bin "small$r")
  read -r bk bf < <(one big.bin "big$r")
  small_k+=("$sk"); big_k+=("$bk"); small_f+=("$sf"); big_f+=("$bf")
  # shellcheck disable=SC2059
  printf "$fmt" "$r" "$sk" "$sf" "$bk" "$bf"
done
ms=$(median "${small_k[@]}") mb=$(median "${big_k[@]}")
# shellcheck disable=SC2059
printf "$fmt" "median" "$ms" "$(median "${small_f[@]}")" "$mb" "$(median "${big_f[@]}")"
echo "# kill->next, ${big_gib} GiB / 1 MiB: $(awk -v a="$mb" -v b="$ms" 'BEGIN { printf "%.2f", a / b }') (target <= 1.20)"
