#!/usr/bin/env bash
# Issue 13's GPU points on one lent GPU, in one pass, each phase bounded in
# time so that a slow one cannot eat the others (the device tool lends few
# minutes). Run from the repository root on the GPU machine:
#
#   OUT=/some/dir bench/gpu.sh
#
# (here, before: bench/gpu-deps.sh, then the device tool's run with carry
# [".deps"]; the machine's start and each call count against its budget,
# so plan one call, BUDGET a little under the call's limit.)
#
# 1. builds ob against the PyTorch wheel's LibTorch (CUDA) and NCCL, with our
#    other dependencies unpacked from bookworm .debs (.deps/debs, fetched
#    with `apt-get download`) into a prefix of their own; runs the unit
#    tests; profiles MODEL on the GPU in bf16;
# 2. trains MODELS with ob-launch (one host, one slot, one stage, bf16):
#    tokens/s, MFU, peak memory from the metrics stream;
# 3. the same model, batch, sequence and precision in bench/peers/torch_loop.py
#    (plain eager PyTorch, SDPA, fused AdamW);
# 4. kills the worker with SIGKILL at step KILL_STEP: the agent restarts it
#    from its host snapshot; the `recovered` line of events.log gives kill to
#    next completed step and its phases.
# Steps 20-21 of the first model's ob run and of its peer run are traced
# (OB_TRACE, torch_loop.py --trace) and compared by bench/trace_summary.py:
# GPU busy and idle time per step, kernel time by kind, the top kernels.
# Results: OUT/summary.txt, and the logs and gzipped traces in OUT/detail.tar.gz.
#
# Environment: OUT, PYTHON (python3 with torch), MODELS ("gpt2-medium
# gpt2-large"), MB (8), GB (32), SEQ (1024), STEPS (100), SKIP (10),
# KILL_STEP (50), WIDE_MB (32) and WIDE_GB (64), CHECKS (lines "TEST_BINARY CATCH_FILTER" run right after
# the build; default the model's GPU product and kernel tests; a failed
# GeluMlp, LayerNorm, Linear or cross-entropy check switches that kernel off for the
# runs, OB_LT_GELU=0, OB_LN_KERNEL=0, OB_GEMM_ACCUMULATE=0 or OB_FUSED_LOSS=0, and says so), KILL=0 (no kill run), UNIT=0 (no unit tests), TRAIN=0 (no
# plain run of the first model, nor its peer), BUDGET (seconds for the whole pass, 420), BUILD (build
# directory; build-gpu), NO_BUILD=1 (use BUILD as it is), DEVICE (cuda; cpu
# for a dry run of this script on a machine without a GPU).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/ob-gpu}
py=${PYTHON:-python3}
models=${MODELS:-gpt2-medium gpt2-large}
mb=${MB:-8} gb=${GB:-32} seq=${SEQ:-1024} steps=${STEPS:-100} skip=${SKIP:-10}
kill_step=${KILL_STEP:-50}
budget=${BUDGET:-420}
bd=${BUILD:-$root/build-gpu}
device=${DEVICE:-cuda}
deps=/tmp/ob-deps
mkdir -p "$out"
summary=$out/summary.txt
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( budget - $(elapsed) )); }
say() { echo "[$(elapsed)s] $*" | tee -a "$summary"; }
# phase NAME SECONDS: true when at least SECONDS of the budget are left.
phase() {
  if [ "$(left)" -lt "$2" ]; then say "$1: skipped, $(left) s of the budget left"; return 1; fi
  echo "[$(elapsed)s] == $1" >&2
}
cd "$root"
: > "$summary"
# The device tool brings back only a few files: at the end (or when killed
# by a timeout), everything but the summary goes into one archive.
pack() {
  (cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt ! -name detail.tar.gz -printf '%P\n' |
     tar czf detail.tar.gz -T - --remove-files 2> /dev/null)
}
trap pack EXIT
trap 'exit 143' TERM

# --- the machine -----------------------------------------------------------
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1
  echo "$(getconf _NPROCESSORS_ONLN) cores; $(g++ --version | head -1); $(cmake --version | head -1)"
} | tee -a "$summary"
if [ "$device" = cuda ]; then
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
else
  gpu_name=cpu
fi

# --- build -----------------------------------------------------------------
torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
site=$(dirname "$torch_dir")
if [ "${NO_BUILD:-0}" != 1 ]; then
  rm -rf "$deps"; mkdir -p "$deps"
  for f in .deps/debs/*.deb; do dpkg -x "$f" "$deps"; done
  # c10d's Gloo headers: the wheel's own when it has them, else bookworm's.
  if [ ! -d "$torch_dir/include/gloo" ]; then
    for f in .deps/debs-gloo/*.deb; do dpkg -x "$f" "$deps"; done
  fi
fi
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nccl_h=$(find "$site/nvidia" -name nccl.h 2>/dev/null | head -1)
nccl_so=$(find "$site/nvidia" -name 'libnccl.so*' 2>/dev/null | head -1)
cublas_so=$(find "$site/nvidia" -name 'libcublas.so*' 2>/dev/null | head -1)
cublaslt_so=$(find "$site/nvidia" -name 'libcublasLt.so*' 2>/dev/null | head -1)
std=17
if grep -rqs "C++20 or later" "$torch_dir/include/c10/macros" "$torch_dir/include/c10/util/C++17.h"; then std=20; fi
say "torch at $torch_dir; NCCL ${nccl_h:-none} ${nccl_so:-none}; cuBLAS ${cublas_so:-from the toolkit}, ${cublaslt_so:-cuBLASLt from the toolkit}; C++$std"
built=0
if [ "${NO_BUILD:-0}" = 1 ]; then
  built=1
elif phase build 120; then
  cuda_args=()
  if [ "$device" = cuda ]; then
    cuda_args=(-DOB_CUDA=ON -DOB_NCCL_INCLUDE_DIR="$(dirname "$nccl_h")" -DOB_NCCL_LIBRARY="$nccl_so"
               -DOB_CUBLAS_LIBRARY="$cublas_so" -DOB_CUBLASLT_LIBRARY="$cublaslt_so")
  fi
  if cmake -S . -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=$std \
      -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include -g1" \
      "${cuda_args[@]}" > "$out/configure.log" 2>&1; then
    jobs=$(getconf _NPROCESSORS_ONLN)
    # First the tools and the torch unit tests, so that a slow rest still
    # leaves something to run; then everything.
    timeout $(( $(left) - 150 )) cmake --build "$bd" -j "$jobs" -- -k 0 \
        ob-launch ob-profile ob-plan ob-watch ob-ckpt > "$out/build.log" 2>&1 && built=1
    grep -E "error|Error" "$out/build.log" | head -40 | tee -a "$summary"
    say "build of the tools: $([ $built = 1 ] && echo ok || echo FAILED)"
  else
    tail -30 "$out/configure.log" | tee -a "$summary"
    say "configure FAILED"
  fi
fi
bin=$bd/bin
[ $built = 1 ] && "$bin/ob-launch" --version -v 2>&1 | tee -a "$summary"

# --- checks of a change on the GPU, before the measurements -----------------
# CHECKS: lines of "TEST_BINARY CATCH_FILTER"; their binaries are built and
# the filtered cases run first, their failures in the summary. Default: the
# GPU halves of the model's own products and kernels (CHECKS= for none).
CHECKS=${CHECKS-"model_test GeluMlp*
model_test Linear sums*
model_test the head's cross-entropy*
model_test LayerNorm*
model_test compute copies*"}
if [ -n "$CHECKS" ] && [ $built = 1 ] && phase checks 60; then
  bins=$(printf '%s\n' "$CHECKS" | awk 'NF { print $1 }' | sort -u | tr '\n' ' ')
  # shellcheck disable=SC2086
  timeout 120 cmake --build "$bd" -j "$(getconf _NPROCESSORS_ONLN)" -- $bins > "$out/build-checks.log" 2>&1 \
    || say "checks: build FAILED: $(grep -a -m5 'error' "$out/build-checks.log")"
  # run_check LOG WHAT CHECK FILTER: one check, its exit code and the
  # binary's own pass/fail line in the summary; returns its exit code.
  run_check() {
    (cd "$bd" && OMP_NUM_THREADS=1 timeout 90 "tests/$3" "$4" > "$1" 2>&1)
    local rc=$?
    say "$2 $3 \"$4\": exit $rc; $(grep -a 'passed\|failed' "$1" | tail -1)"
    return $rc
  }
  n=0
  rm -f "$out/fallbacks"
  # In a subshell, and not named `bin` (the tools' directory below): the
  # loop's variables must not leak into the rest of the script.
  (while read -r check filter; do
    [ -n "$check" ] || continue
    n=$((n + 1))
    run_check "$out/check-$n.log" check "$check" "$filter"
    rc=$?
    # A kernel of ob's own that fails its check is switched off for the
    # runs below (ATen's kernels instead), so they still train the model.
    if [ $rc != 0 ]; then
      case "$filter" in
        GeluMlp*) echo OB_LT_GELU=0 >> "$out/fallbacks" ;;
        LayerNorm*) echo OB_LN_KERNEL=0 >> "$out/fallbacks" ;;
        "Linear sums"*) echo OB_GEMM_ACCUMULATE=0 >> "$out/fallbacks" ;;
        "the head's cross-entropy"*) echo OB_FUSED_LOSS=0 >> "$out/fallbacks" ;;
      esac
    fi
    grep -a -B2 -A12 'FAILED' "$out/check-$n.log" | head -60 | tee -a "$summary"
    grep -a '^#' "$out/check-$n.log" | head -5 | tee -a "$summary"
    grep -a -A3 'warning:' "$out/check-$n.log" | head -12 | tee -a "$summary"
  done <<< "$CHECKS")
  if [ -s "$out/fallbacks" ]; then
    # shellcheck disable=SC2046
    export $(sort -u "$out/fallbacks")
    say "after failed checks, the runs below use: $(sort -u "$out/fallbacks" | tr '\n' ' ')"
    # The same checks again on the path the runs will take (a switched-off
    # kernel's test then checks ATen's path, or skips its GPU half).
    (n=0; while read -r check filter; do
      [ -n "$check" ] || continue
      n=$((n + 1))
      run_check "$out/recheck-$n.log" "check again with them:" "$check" "$filter"
    done <<< "$CHECKS")
  fi
fi

# --- the plain PyTorch peer --------------------------------------------------
tag=""  # names the runs of a second batch shape (WIDE_MB)
peer() {  # peer MODEL [ARGS...]: one run of torch_loop.py, its summary line
  local m=$1; shift
  env -u LD_LIBRARY_PATH timeout 150 "$py" bench/peers/torch_loop.py --model "$m" --micro-batch "$mb" \
    --global-batch "$gb" --seq-len "$seq" --steps "$steps" --skip "$skip" --device "$device" \
    --json "$out/peer-$m$tag.json" "$@" > "$out/peer-$m$tag.log" 2>&1
  say "peer $m$tag: $(tail -1 "$out/peer-$m$tag.log")"
}

# --- ob on one GPU -------------------------------------------------------------
work=/tmp/ob-gpu-work
rm -rf "$work"; mkdir -p "$work"
echo gpu0 > "$work/hosts.txt"
(umask 077; echo gpu-bench-secret-0123456789 > "$work/secret")
ob_summary() {  # ob_summary RUN: tokens/s, MFU, peak memory of rank 0 over steps >= SKIP
  "$bin/ob-watch" --records json "$1.metrics" 2> /dev/null | "$py" -c '
import json, sys
skip = int(sys.argv[1]); rows = []
for line in sys.stdin:
    r = json.loads(line)
    if r.get("heartbeat") or int(r.get("rank", 0)) != 0 or int(r.get("step", -1)) < skip:
        continue
    rows.append(r)
if not rows:
    print("no step records"); sys.exit()
sec = sum(float(r.get("step_seconds", 0)) for r in rows)
tps = sorted(float(r.get("tokens_per_second", 0)) for r in rows)
mfu = sorted(float(r.get("mfu", 0)) for r in rows)
peak = max(float(r.get("peak_memory_bytes", 0)) for r in rows)
snaps = sorted(float(r.get("snapshot_seconds", 0)) for r in rows)
snap = sum(snaps) / len(rows)
print(f"steps {skip}..{skip + len(rows) - 1}: median tokens/s {tps[len(tps) // 2]:.0f}, mean step {sec / len(rows):.4f} s, "
      f"median MFU {mfu[len(mfu) // 2]:.3f}, peak memory {peak / 2**30:.2f} GiB, snapshot on the training thread {snap:.4f} s/step "
      f"(median {snaps[len(snaps) // 2]:.4f}, max {snaps[-1]:.4f})")
' "$skip"
}
train() {  # train NAME MODEL [ARGS...]: ob-launch, 100 steps
  local name=$1 m=$2; shift 2
  timeout 200 "$bin/ob-launch" --rsh local --secret-file "$work/secret" --steps "$steps" \
    --device "$device" --run-dir "$work/$name" --metrics "$work/$name.metrics" "$@" \
    "$work/plan-$m.pb" "$work/hosts.txt" > "$out/$name.out" 2> "$out/$name.err"
  local rc=$?
  say "ob $name: exit $rc; $(grep -a 'trained' "$out/$name.err" | tail -1)"
  say "ob $name: $(grep -a -m1 -o 'the MLP.s cuBLASLt GELU epilogues.*' "$out/$name.err")"
  say "ob $name: $(ob_summary "$work/$name")"
  [ $rc = 0 ] || tail -5 "$out/$name.err" | tee -a "$summary"
  return $rc
}

first=${models%% *}
# profile_plan MODEL: a measured profile on the device (bf16) and a plan of
# one pipeline on the one host.
profile_plan() {
  local m=$1
  timeout 120 "$bin/ob-profile" --model "$m" --device "$device" --dtype bfloat16 --seq-len "$seq" --warmup 2 -k 5 \
      -b "$mb" -o "$work/profile-$m.pb" 2> "$out/profile-$m.err" \
    && "$bin/ob-plan" --hosts "$work/hosts.txt" -g 1 -f 0 -B "$gb" -b "$mb" \
      -o "$work/plan-$m.pb" --explain "$work/profile-$m.pb" > "$out/plan-$m.txt" 2>&1
  local rc=$?
  "$bin/ob-profile" --table "$work/profile-$m.pb" > "$out/profile-$m.txt" 2>&1
  say "profile+plan $m: exit $rc; $(tail -n 2 "$out/profile-$m.err" | tr '\n' ' ') $(tail -n 2 "$out/plan-$m.txt" 2> /dev/null | tr '\n' ' ')"
  say "profile+plan $m: $(grep -h '^# one micro-batch' "$out/profile-$m.txt") | $(grep -h -A2 '^# nodes stages' "$out/plan-$m.txt" 2> /dev/null | tail -n 1 | tr -s ' ') | $(grep -h '^# predicted iteration' "$out/plan-$m.txt" 2> /dev/null)"
  return $rc
}
if [ $built = 1 ] && phase "profile $first" 60; then profile_plan "$first"; fi

# Both traced over steps 20-21 (Kineto): where each one's step goes.
mkdir -p "$work/trace"
if [ "${TRAIN:-1}" = 1 ] && [ $built = 1 ] && [ -s "$work/plan-$first.pb" ] && phase "ob $first" 60; then
  OB_TRACE=$work/trace train "train-$first" "$first" --precision bf16
fi
if [ "${TRAIN:-1}" = 1 ] && phase "peer $first" 50; then peer "$first" --trace "$work/trace/peer.json"; fi
if [ -s "$work/trace/trace-rank-0.json" ] || [ -s "$work/trace/peer.json" ]; then
  args=()
  [ -s "$work/trace/trace-rank-0.json" ] && args+=("ob=$work/trace/trace-rank-0.json")
  [ -s "$work/trace/peer.json" ] && args+=("peer=$work/trace/peer.json")
  env -u LD_LIBRARY_PATH "$py" bench/trace_summary.py --steps 2 --json "$out/trace-summary.json" "${args[@]}" \
    > "$out/trace-summary.txt" 2>&1
  head -80 "$out/trace-summary.txt" | tee -a "$summary"
  for f in "$work"/trace/*.json; do gzip -c "$f" > "$out/$(basename "$f").gz"; done
fi

# Kill -9 of the worker at KILL_STEP.
if [ "${KILL:-1}" = 1 ] && [ $built = 1 ] && [ -s "$work/plan-$first.pb" ] && phase "kill -9 at step $kill_step" 70; then
  (
    end=$(( $(date +%s) + 150 ))
    until [ "$("$py" tests/lib/metrics.py max-step "$work/kill.metrics" 2> /dev/null || echo -1)" -ge "$kill_step" ]; do
      [ "$(date +%s)" -lt "$end" ] || exit 1
      sleep 0.05
    done
    pids=$(pgrep -x ob-worker-0 | tr '\n' ' ')
    echo "killing worker(s) $pids at $(date +%s%3N)"
    # shellcheck disable=SC2086
    kill -9 $pids
  ) > "$out/kill.killer" 2>&1 &
  train kill "$first" --precision bf16
  wait
  say "kill: $(cat "$out/kill.killer")"
  grep -a "recovered\|restart\|lost" "$work/kill/events.log" | head -5 | tee -a "$summary"
  # The steps around the kill, in the order they completed: do the first
  # steps after the restart pay for the arena's page-locking (a thread of
  # the worker's own since this session)?
  "$bin/ob-watch" --records json "$work/kill.metrics" 2> /dev/null | "$py" -c '
import json, sys
k = int(sys.argv[1]); out = []
for line in sys.stdin:
    r = json.loads(line)
    if r.get("heartbeat") or int(r.get("rank", 0)) != 0: continue
    s = int(r.get("step", -1))
    if k - 3 <= s <= k + 15:
        out.append("%d:%.3f/%.3f" % (s, float(r.get("step_seconds", 0)), float(r.get("snapshot_seconds", 0))))
print("kill: step:seconds/snapshot-seconds around the kill: " + " ".join(out))
' "$kill_step" | tee -a "$summary"
fi

# The unit tests: the rest of the build first.
if [ "${UNIT:-1}" = 1 ] && [ $built = 1 ] && phase "unit tests" 40; then
  timeout $(( $(left) - 10 )) cmake --build "$bd" -j "$(getconf _NPROCESSORS_ONLN)" > "$out/build-rest.log" 2>&1 \
    && (cd "$bd" && OMP_NUM_THREADS=1 timeout $(( $(left) - 5 )) ctest -j "$(getconf _NPROCESSORS_ONLN)" --timeout 120 --output-on-failure \
          -E '^(process|cli|fuzz)\.' > "$out/unit.log" 2>&1)
  say "unit tests: exit $?; $(grep -a 'tests passed\|tests failed' "$out/unit.log" 2> /dev/null | tail -1)"
  grep -a "Failed\|\*\*\*" "$out/unit.log" 2> /dev/null | head -20 | tee -a "$summary"
  # A crashed test's stack, where the machine has gdb.
  grep -a "Exception: SegFault\|Child aborted" "$out/unit.log" 2> /dev/null | head -2 |
    sed -E 's/.*Test +#[0-9]+: ([a-z_]+)\.(.*[^ ]) \.\.\.+.*/\1\t\2/' |
    while IFS=$'\t' read -r exe name; do
      if command -v gdb > /dev/null && [ -x "$bd/tests/$exe" ] && [ "$(left)" -gt 40 ]; then
        (cd "$bd" && OMP_NUM_THREADS=1 timeout 60 gdb -batch -ex run -ex bt -ex "info threads" --args "tests/$exe" "$name" 2>&1) \
          | grep -a -A40 "SIGSEGV\|SIGABRT" | head -60 > "$out/gdb-$exe.txt"
        say "gdb $exe: $(head -c 3000 "$out/gdb-$exe.txt")"
      elif [ -x "$bd/tests/$exe" ] && [ "$(left)" -gt 30 ] && gcc -shared -fPIC -O1 -o "$out/segv_backtrace.so" bench/segv_backtrace.c; then
        # No gdb: the stack from a handler preloaded ahead of Catch's, each
        # "object(+offset)" frame through addr2line.
        (cd "$bd" && OMP_NUM_THREADS=1 LD_PRELOAD="$out/segv_backtrace.so" timeout 60 "tests/$exe" "$name" 2>&1) \
          | grep -a -A64 "segv_backtrace:" | head -70 > "$out/stack-$exe.txt"
        sed -nE 's/^([^ (]+)\((\+0x[0-9a-f]+)\).*/\1 \2/p' "$out/stack-$exe.txt" | while read -r obj off; do
          printf '%s %s: %s\n' "$(basename "$obj")" "$off" "$(addr2line -C -f -i -e "$obj" "$off" 2> /dev/null | paste -sd' ')"
        done > "$out/stack-$exe-lines.txt"
        # Both: a frame the handler printed with a symbol (or a bare [0x0])
        # has no "+offset" line for addr2line.
        say "stack of $exe ($name): $(head -c 2000 "$out/stack-$exe.txt"); through addr2line: $(head -c 2000 "$out/stack-$exe-lines.txt")"
      else
        say "crash in $exe ($name): no gdb here or no time"
      fi
    done
fi

# The second model, where the budget allows.
for m in $models; do
  [ "$m" = "$first" ] && continue
  if [ $built = 1 ] && phase "ob $m" 150; then
    profile_plan "$m" && train "train-$m" "$m" --precision bf16
  fi
  if phase "peer $m" 60; then peer "$m"; fi
done

# The first model again at a larger micro-batch (WIDE_MB, WIDE_GB; WIDE_MB=0
# for none), ob and the peer: how much of the distance to the MFU target is
# per-micro-batch cost (launches, casts) rather than the kernels themselves.
wide_mb=${WIDE_MB:-32} wide_gb=${WIDE_GB:-64}
if [ "$wide_mb" -gt 0 ] && [ $built = 1 ] && phase "ob $first at micro-batch $wide_mb" 110; then
  mb=$wide_mb gb=$wide_gb tag=-mb$wide_mb
  profile_plan "$first" && train "train-$first$tag" "$first" --precision bf16
  if phase "peer $first$tag" 50; then peer "$first"; fi
fi

say "done"
