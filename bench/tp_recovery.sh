#!/usr/bin/env bash
# Recovery time with tensor parallelism and several stages a node (issue
# 11, acceptance 5): gpt-tiny on 3 local hosts of 4 slots, ob-plan -g 4
# --tp 2 -f 1 (2 stages a node, each over 2 TP ranks: 12 workers); every
# process of host 2 (its agent, its 4 workers, its standbys) is killed
# with SIGKILL at step KILL_STEP, and the time from the kill to the next
# completed step (the first `recovered` line of events.log after the kill)
# is measured, with the phases the master logs.
#
# RESHARD=1: the plan adds --template-tp 1=4 -B 3 (a tp-2 2-node pipeline
# beside a tp-4 1-node one); the kill moves host 1 onto the 1-node
# template, whose ranks re-cut their tp-2 state into tp-4 shards.
#
#   bench/tp_recovery.sh [RUNS]        (default 5; medians)
#
# Environment: OB_BIN (default build/bin), STEPS (40), KILL_STEP (15),
# RESHARD (0).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
TAG=tpr$$h
bench_cluster tp-recovery "$TAG"
printf '%s1 slots=4\n%s2 slots=4\n%s3 slots=4\n' "$TAG" "$TAG" "$TAG" > hosts.txt
runs=${1:-5}
steps=${STEPS:-40}
kill_step=${KILL_STEP:-15}
bench_need ob-profile ob-plan ob-launch

"$bin/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q -o tiny.pb
what="tp 2 and 2 stages a node"
plan_flags=(-B 8)
if [ "${RESHARD:-0}" = 1 ]; then
  what="a tp-2 pipeline (2 stages a node) beside a tp-4 one, re-cut to tp 4"
  plan_flags=(-B 3 --template-tp 1=4)
fi
"$bin/ob-plan" --hosts hosts.txt -g 4 --tp 2 -f 1 "${plan_flags[@]}" --gpu-memory 0.1 --overhead-gib 0 -o plan.pb tiny.pb

# one RUN: prints "kill_to_next_ms detect decide teardown regroup copy first_step" or dashes.
one() {
  local run=$1 kill_ms line
  kill_ms=$(kill_host_at "$run" "${TAG}2" "$kill_step" "$root/tests/data/corpus.txt") || { echo "- - - - - - -"; return; }
  line=$(grep ' recovered ' "$run/events.log" | head -1 || true)
  [ -n "$line" ] || { echo "- - - - - - -"; return; }
  phase() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<< "$line"; }
  echo "$(( $(date -d "${line%% *}" +%s%3N) - kill_ms )) $(phase detect_ms) $(phase decide_ms)" \
       "$(phase teardown_ms) $(phase regroup_ms) $(phase copy_ms) $(phase first_step_ms)"
}

echo "# recovery with $what: gpt-tiny, 3 local hosts x 4 slots, SIGKILL of host 2 (4 workers) at step $kill_step"
echo "#   kill->next = the kill to the first 'recovered' line after it; phases as the master logs them (ms)"
echo "#   $(nproc) cores; $("$bin/ob-launch" --version); $(date -u +%Y-%m-%d)"
fmt='%-6s %10s %8s %8s %9s %8s %8s %11s\n'
# shellcheck disable=SC2059
printf "$fmt" "# run" "kill->next" detect decide teardown regroup copy first_step
totals=()
for r in $(seq 1 "$runs"); do
  read -r k d de t g c f < <(one "run$r")
  # shellcheck disable=SC2059
  printf "$fmt" "$r" "$k" "$d" "$de" "$t" "$g" "$c" "$f"
  [ "$k" = - ] || totals+=("$k")
done
[ "${#totals[@]}" -gt 0 ] || { echo "tp_recovery.sh: no run recovered" >&2; exit 1; }
echo "median kill->next: $(median "${totals[@]}") ms over ${#totals[@]} runs (target <= 2000)"
