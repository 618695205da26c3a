#!/usr/bin/env bash
# Rules the project's sources keep.
#  - No std::filesystem::remove_all: the PyTorch wheel's libtorch.so
#    exports its own copy, which our binaries bind to and which crashes (a
#    call through a null pointer, seen on the lent GPU machine with
#    LibTorch 2.11); io::RemoveTree replaces it.
#  - No ';' in a Catch test's name: catch_discover_tests hands CTest the
#    names as a CMake list, which splits there, and under trixie's CMake
#    (check-libtorch2) the halves ran as two tests that matched nothing
#    and failed (2026-11-29).
#  - A test script that calls assert.sh's `finish` calls it last: its status
#    is the script's only when nothing runs after it (profile_bad_input.sh
#    had 28 lines of checks after it, whose failures exited 0).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
hits=$(grep -rn --include='*.cc' --include='*.h' 'remove_all *(' "$root/lib" "$root/tools" "$root/tests" "$root/bench" 2> /dev/null || true)
if [ -n "$hits" ]; then
  echo "std::filesystem::remove_all is not to be called (use ob::io::RemoveTree):" >&2
  echo "$hits" >&2
  exit 1
fi
hits=$(grep -rnE 'TEST_CASE\("[^"]*;' "$root/tests" 2> /dev/null || true)
if [ -n "$hits" ]; then
  echo "a test name holds ';', where CMake lists split it:" >&2
  echo "$hits" >&2
  exit 1
fi
for f in "$root"/tests/cli/*.sh "$root"/tests/process/*.sh; do
  last_finish=$(grep -n '^finish$' "$f" | tail -1 | cut -d: -f1 || true)
  [ -z "$last_finish" ] && continue
  last_line=$(grep -n '[^[:space:]]' "$f" | tail -1 | cut -d: -f1)
  if [ "$last_finish" != "$last_line" ]; then
    echo "$f:$last_finish: 'finish' is not the script's last command (line $last_line is)" >&2
    exit 1
  fi
done
echo "source rules: ok"
