# Shared set-up for tests/process/launch_*.sh: a plan for N local hosts with
# names unique to this test, a secret, and cleanup of every process whose
# command line carries this test's tag. Source after setting NAME.
set -u
OB_BIN=${OB_BIN:?OB_BIN must name the directory holding ob-launch and ob-plan}
OB_SOURCE_DIR=${OB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
skip() { echo "$NAME: skipped: $*" >&2; exit 77; }
fail() { echo "$NAME: FAIL: $*" >&2; exit 1; }
[ -x "$OB_BIN/ob-launch" ] || fail "no $OB_BIN/ob-launch"
[ -x "$OB_BIN/ob-plan" ] || skip "no $OB_BIN/ob-plan to make a plan"
command -v pgrep >/dev/null || skip "no pgrep"

TAG="t$$x$RANDOM"                 # in host names and worker commands
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ob-$NAME.XXXXXX")
MASTER_PID=""

# Agents carry the tag in --host; workers in their environment (OB_HOST), so
# a worker's own children are found too, whatever their command line.
tagged() {
  { pgrep -f -- "--host $TAG"; grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ | cut -d/ -f3; } \
    | grep -vx "$$" | sort -u || true
}
cleanup() {
  [ -n "$MASTER_PID" ] && kill -9 "$MASTER_PID" 2>/dev/null
  local p
  for p in $(tagged); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# make_cluster N: $WORK/hosts.txt with N hosts ${TAG}h1.., $WORK/plan.pb, $WORK/secret.
make_cluster() {
  local n=$1 i
  : > "$WORK/hosts.txt"
  for ((i = 1; i <= n; i++)); do echo "${TAG}h$i" >> "$WORK/hosts.txt"; done
  "$OB_BIN/ob-plan" --hosts "$WORK/hosts.txt" -g 1 -f 1 -B 8 -o "$WORK/plan.pb" \
    "$OB_SOURCE_DIR/tests/fuzz/corpus/profile.pb" || fail "ob-plan"
  (umask 077; echo "secret-$TAG" > "$WORK/secret")
}

# wait_for SECONDS CMD...: polls CMD every 0.05 s; false after SECONDS.
wait_for() {
  local end=$(( $(date +%s%N) + ${1%.*} * 1000000000 )); shift
  until "$@"; do
    [ "$(date +%s%N)" -lt "$end" ] || return 1
    sleep 0.05
  done
}

count_tagged() { tagged | grep -c . ; }
no_tagged() { [ "$(count_tagged)" = 0 ]; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Worker processes of this test now running (found by OB_HOST).
count_workers() { grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ | grep -c . ; }
