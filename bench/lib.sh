# Shared by the benches: source after `set -euo pipefail`. Defines
# functions only; nothing runs until a bench calls them.
#
# bench_paths: sets root (the source tree) and bin (OB_BIN, default
# build/bin).
bench_paths() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  bin=${OB_BIN:-$root/build/bin}
}

# bench_workdir NAME [PATTERN [SIGNAL]]: bench_paths, and a scratch
# directory work=/tmp/ob-NAME.XXXXXX made the current one and removed on
# exit. With PATTERN, every process whose command line matches it (pkill
# -f: the agents and workers of the bench's hosts) is sent SIGNAL (TERM by
# default) on exit first.
bench_workdir() {
  bench_paths
  work=$(mktemp -d "/tmp/ob-$1.XXXXXX")
  if [ -n "${2:-}" ]; then
    # shellcheck disable=SC2064  # expanded now, on purpose
    trap "pkill ${3:+-$3 }-f -- '$2' 2>/dev/null || true; rm -rf '$work'" EXIT
  else
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
  fi
  cd "$work"
}

# bench_secret: the job's shared secret, ./secret, mode 600 (ob-launch
# wants 16 bytes at least).
bench_secret() {
  (umask 077; echo "bench-secret-0123456789" > secret)
}

# bench_cluster NAME TAG: bench_workdir NAME, whose exit also stops every
# agent of hosts TAG1..TAG4, holding hosts.txt (TAG1..TAG4) and the secret.
# Sets root, bin (OB_BIN, default build/bin) and work.
bench_cluster() {
  bench_workdir "$1" "--host $2[0-9]"
  printf '%s1\n%s2\n%s3\n%s4\n' "$2" "$2" "$2" "$2" > hosts.txt
  bench_secret
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
