#!/usr/bin/env bash
# bench/trace_summary.py charges the compute stream's idle gaps to the
# host's ob:: phase and CUDA call under way when the stream ran dry
# (a synthetic Kineto trace with known gaps).
set -euo pipefail
root=${OB_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/trace.json" <<'PY'
import json, sys
k = lambda name, ts, dur, stream: {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                                   "ts": ts, "dur": dur, "args": {"stream": stream}}
host = lambda cat, name, ts, dur, tid=1: {"ph": "X", "cat": cat, "name": name, "pid": 10, "tid": tid,
                                          "ts": ts, "dur": dur}
events = [
    k("ampere_gemm", 0, 100, 7),          # compute stream: 0-100
    k("vectorized_elementwise", 300, 100, 7),  # gap 200 us at t=100
    k("vectorized_elementwise", 405, 95, 7),   # gap 5 us: launch latency, not charged
    k("ampere_gemm", 800, 100, 7),        # gap 300 us at t=500
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": 9, "ts": 100, "dur": 250,
     "args": {"stream": 9}},              # side stream: not the compute stream
    host("user_annotation", "ob::step", 0, 450),
    host("user_annotation", "ob::update", 90, 160),
    host("user_annotation", "ob::forward", 0, 60),
    host("cuda_runtime", "cudaStreamSynchronize", 50, 60),
    host("cuda_runtime", "cudaLaunchKernel", 120, 5),
    host("cuda_runtime", "cudaMemcpyAsync", 480, 10, tid=2),  # another thread, ended before t=500
]
json.dump({"traceEvents": events}, open(sys.argv[1], "w"))
PY
out=$(python3 "$root/bench/trace_summary.py" --steps 1 ob="$dir/trace.json")
echo "$out"
expect() {
  if ! grep -Eq "$1" <<< "$out"; then
    echo "FAIL: expected a line matching: $1" >&2
    exit 1
  fi
}
expect '^compute_idle_ms +0\.50$'
expect '^  ob::update +0\.20$'
expect '^  \(no ob:: range\) +0\.30$'
expect '^  cudaStreamSynchronize +0\.20$'
expect '^  \(no CUDA call\) +0\.30$'
echo "trace_summary: ok"
