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
  (umask 077; echo "bench-secret" > secret)
}

# closing_tokens ERR_FILE: the tokens/s of ob-launch's closing line
# ("trained N steps: final loss X, Y tokens/s").
closing_tokens() {
  sed -n 's/.*trained [0-9]* steps: final loss [0-9.]*, \([0-9]*\) tokens\/s.*/\1/p' "$1"
}

# median N...: the median (the lower middle one of an even count).
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
