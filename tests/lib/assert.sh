# Shared helpers for tests/cli and tests/process scripts (bash).
# OB_BIN and OB_SOURCE_DIR come from CTest's environment.
set -u
: "${OB_BIN:?OB_BIN must point at the built bin/ directory}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ob-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
FAILS=0
PASSES=0
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"

fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { PASSES=$((PASSES + 1)); }

# expect RC PATTERN -- CMD...: runs CMD, checks its exit status and that
# stderr matches the extended regex PATTERN ('' for no check), and that
# stderr is exactly one line when RC is not 0.
expect() {
  local rc=$1 pattern=$2; shift 3
  local got
  "$@" >"$TMP/out" 2>"$TMP/err"; got=$?
  if [ "$got" != "$rc" ]; then
    fail "$*: exit $got, expected $rc; stderr: $(head -c 400 "$TMP/err")"; return
  fi
  if [ -n "$pattern" ] && ! grep -Eq -- "$pattern" "$TMP/err"; then
    fail "$*: stderr lacks /$pattern/: $(head -c 400 "$TMP/err")"; return
  fi
  if [ "$rc" != 0 ] && [ "$(grep -c '' "$TMP/err")" != 1 ]; then
    fail "$*: expected one line on stderr, got: $(cat "$TMP/err")"; return
  fi
  pass
}

finish() {
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" = 0 ]
}
