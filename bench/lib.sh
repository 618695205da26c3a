# Shared by the overhead benches (bench/ckpt_overhead.sh,
# bench/watch_overhead.sh): source after `set -euo pipefail`.
#
# bench_cluster NAME TAG: a scratch directory /tmp/ob-NAME.XXXXXX (removed,
# with every agent of hosts TAG1..TAG4, on exit) made the current one,
# holding hosts.txt (TAG1..TAG4) and a mode-600 secret. Sets root, bin
# (OB_BIN, default build/bin) and work.
bench_cluster() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  bin=${OB_BIN:-$root/build/bin}
  work=$(mktemp -d "/tmp/ob-$1.XXXXXX")
  # shellcheck disable=SC2064  # expanded now, on purpose
  trap "pkill -f -- '--host $2[0-9]' 2>/dev/null || true; rm -rf '$work'" EXIT
  cd "$work"
  printf '%s1\n%s2\n%s3\n%s4\n' "$2" "$2" "$2" "$2" > hosts.txt
  (umask 077; echo "bench-secret-0123456789" > secret)
}

# bench_need TOOL...: exits 1 unless each of ob's TOOLs is built in $bin
# (the message names the calling script).
bench_need() {
  local t
  for t in "$@"; do
    [ -x "$bin/$t" ] || { echo "$(basename "$0"): $bin/$t: not found (build first, or set OB_BIN)" >&2; exit 1; }
  done
}

# closing_tokens ERR_FILE: the tokens/s of ob-launch's closing line
# ("trained N steps: final loss X, Y tokens/s").
closing_tokens() {
  sed -n 's/.*trained [0-9]* steps: final loss [0-9.]*, \([0-9]*\) tokens\/s.*/\1/p' "$1"
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
max_step() { [ -s "$1" ] && python3 "$root/tests/lib/metrics.py" max-step "$1" || echo -1; }

# kill_host_at RUN HOST STEP DATA: trains plan.pb on hosts.txt for $steps
# steps on DATA (run directory RUN, metrics RUN.pb, stderr RUN.err), and
# once a rank reported STEP SIGKILLs every process of HOST (its agent, its
# workers, its standbys) and waits for the master. Prints the kill's time
# (ms since the epoch); fails, printing nothing, when the run ended or
# 240 s passed before STEP.
kill_host_at() {
  local run=$1 host=$2 step=$3 data=$4 pid end pids kill_ms
  timeout 300 "$bin/ob-launch" --rsh local --secret-file secret --run-dir "$run" --steps "$steps" \
    --data "$data" --metrics "$run.pb" plan.pb hosts.txt > /dev/null 2> "$run.err" &
  pid=$!
  end=$(( $(date +%s) + 240 ))
  until [ "$(max_step "$run.pb")" -ge "$step" ]; do
    if ! kill -0 "$pid" 2>/dev/null || [ "$(date +%s)" -ge "$end" ]; then return 1; fi
    sleep 0.05
  done
  pids=$( (pgrep -f -- "--agent .*--host ${host}( |\$)" || true
           grep -lsa "OB_HOST=${host}\b" /proc/[0-9]*/environ | cut -d/ -f3 || true) | sort -u | tr '\n' ' ')
  kill_ms=$(now_ms)
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  wait "$pid" || true
  echo "$kill_ms"
}

# median N...: the median (the lower middle one of an even count).
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
