#!/usr/bin/env bash
# Calls the project's sources must not make. std::filesystem::remove_all:
# the PyTorch wheel's libtorch.so exports its own copy, which our binaries
# bind to and which crashes (a call through a null pointer, seen on the
# lent GPU machine with LibTorch 2.11); io::RemoveTree replaces it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
hits=$(grep -rn --include='*.cc' --include='*.h' 'remove_all *(' "$root/lib" "$root/tools" "$root/tests" "$root/bench" 2> /dev/null || true)
if [ -n "$hits" ]; then
  echo "std::filesystem::remove_all is not to be called (use ob::io::RemoveTree):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "source rules: ok"
