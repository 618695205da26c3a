#!/usr/bin/env bash
# The cost of watching (issue 6, acceptance 7): gpt-tiny on 4 local hosts
# (scripts/quickstart's plan), ROUNDS alternating runs of STEPS steps
# without and with `ob-watch --attach RUN_DIR` (every detector, JSON events
# to a file); the median of ob-launch's closing tokens/s each way.
#
#   bench/watch_overhead.sh [STEPS] [ROUNDS]     (default 300 3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
steps=${1:-300}
rounds=${2:-3}
bench_cluster watch-overhead wov
"$bin/ob-profile" --model gpt-tiny -q -o tiny.pb
"$bin/ob-plan" --hosts hosts.txt -f 1 --global-batch 16 -o plan.pb tiny.pb
run() {  # run NAME WATCH(0|1): prints tokens/s
  rm -rf "run-$1"
  "$bin/ob-launch" --rsh local --secret-file secret --steps "$steps" --data "$root/README.md" \
    --run-dir "run-$1" plan.pb hosts.txt 2> "$1.err" &
  local master=$!
  if [ "$2" = 1 ]; then
    for _ in $(seq 200); do [ -S "run-$1/control.sock" ] && break; sleep 0.05; done
    "$bin/ob-watch" --attach "run-$1" --json > "$1.events" 2> "$1.watch" || true &
  fi
  wait "$master"
  wait
  closing_tokens "$1.err"
}
plain=() watched=()
for ((r = 0; r < rounds; r++)); do
  plain+=("$(run plain 0)")
  watched+=("$(run watched 1)")
  echo "round $r: unwatched ${plain[-1]} tokens/s, watched ${watched[-1]} tokens/s" \
       "($(wc -l < watched.events) events)"
done
p=$(median "${plain[@]}"); w=$(median "${watched[@]}")
awk -v p="$p" -v w="$w" 'BEGIN { printf "median: unwatched %d, watched %d tokens/s: overhead %.1f%% (target <= 1%%)\n", p, w, 100 * (1 - w / p) }'
