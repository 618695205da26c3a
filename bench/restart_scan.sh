#!/usr/bin/env bash
# The master's start on a large --data, the first time and again: how long
# from ob-launch's start to its first events.log line (the data is checked
# before any host is touched), for a file of GIB GiB of random bytes (read
# as bytes: gpt-tiny's vocabulary is 256) on one local host, with the page
# cache dropped before each start (root only; else the reads come from
# memory and the first start is faster than a real one). The first start
# reads the file whole and remembers what it learned (model/scan_cache.h);
# the second reads nothing. OB_CACHE_DIR=off for both shows the old
# behaviour: every start reads the file.
#   bench/restart_scan.sh [GIB]     (default 4)
set -euo pipefail
gib=${1:-4}
source "$(dirname "$0")/lib.sh"
bench_paths
dir=$(mktemp -d "${TMPDIR:-/tmp}/ob-restart-scan.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir"
head -c "${gib}G" /dev/urandom > data.txt
echo h1 > hosts.txt
(umask 077; head -c 32 /dev/urandom | base64 > secret)
"$bin/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 64 -q -o prof.pb
"$bin/ob-plan" --hosts hosts.txt -g 1 -f 0 -B 8 -o plan.pb prof.pb > /dev/null
sleep 2.1  # a file changed in the last 2 s is not remembered
export OB_CACHE_DIR=${OB_CACHE_DIR-$dir/cache}
start() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
  local t0 first
  t0=$(date +%s%N)
  "$bin/ob-launch" --rsh local --secret-file secret --steps 2 --standby off --data data.txt \
    --run-dir "run$1" plan.pb hosts.txt 2> "err$1" || { cat "err$1" >&2; exit 1; }
  first=$(head -1 "run$1/events.log" | cut -c1-23)
  echo $(( $(date -d "${first}Z" +%s%N) / 1000000 - t0 / 1000000 ))
}
a=$(start 1)
b=$(start 2)
echo "restart_scan: ${gib} GiB --data, OB_CACHE_DIR=${OB_CACHE_DIR:-(none)}: first start ${a} ms to the first event, second ${b} ms ($(python3 -c "print(f'{$a/max($b,1):.0f}x')"))"
