#!/usr/bin/env bash
# The GPU points of issues 13 and 58 on one lent GPU, in one pass, each
# phase bounded in time so that a slow one cannot eat the others (the device
# tool lends 15 minutes a task, its start counted). Run from the repository
# root on the GPU machine:
#
#   OUT=/some/dir bench/gpu.sh
#
# (here, before: bench/gpu-deps.sh, then the device tool's run with carry
# [".deps"] and a limit of about 560 s; plan one call, BUDGET a little under
# the call's limit.) Here, without a GPU, a dry run of every phase (Gloo in
# place of NCCL, tiny models; the build into build-gpu from this machine's
# LibTorch, or NO_BUILD=1 BUILD=build):
#
#   DEVICE=cpu PYTHON=/usr/bin/python3 OUT=/tmp/gpu-dry bench/gpu.sh
#
# Phases, in order; a phase that fails is reported and the next one runs:
# 1. build: ob against the PyTorch wheel's LibTorch (CUDA) and NCCL, with
#    our other dependencies unpacked from bookworm .debs (.deps/debs,
#    fetched with `apt-get download`) into a prefix of their own;
# 2. checks: the model's GPU product and kernel tests (CHECKS); a failed
#    one switches its kernel off for the runs below, and says so;
# 3. NCCL: bench/gpu_nccl.sh for each of NCCL_MODELS, several ranks on the
#    one GPU (OB_TEST_NCCL_HOSTS=1: each worker a host of its own to NCCL,
#    over sockets): 2 pipelines x 2 stages against one worker, kill -9 of a
#    host at step 20 recovered from the replicas, a tp-2 stage, a stalled
#    rank found within 5 s and torn down without NCCL's watchdog, in bf16;
# 4. MFU: for each of MFU_RUNS (MODEL:MICRO:GLOBAL), a measured profile and
#    a plan of one pipeline on the one host, ob-launch (tokens/s, MFU by
#    PaLM's and llm.c's counts, peak memory from the metrics stream), and
#    bench/peers/torch_loop.py on the same model, batch, sequence and
#    precision, eager and under torch.compile, in the same call; steps 20-21
#    of the first model's ob run and eager peer run traced (OB_TRACE,
#    --trace) and compared by bench/trace_summary.py;
# 5. kill (right after KILL_MODEL's runs in the MFU phase, the first model
#    by default): SIGKILL of the worker at step KILL_STEP: the agent
#    restarts it from its host snapshot; the `recovered` line of events.log
#    gives kill to next completed step and its phases;
# 6. unit: the rest of the build and its unit tests, as the budget allows.
# Results: OUT/summary.txt (a table of the MFU phase at its end), the logs
# and gzipped traces in OUT/detail.tar.gz.
#
# Environment: OUT, PYTHON (python3 with torch), BUDGET (seconds for the
# whole pass, 530), DEVICE (cuda; cpu for the dry run), BUILD (build
# directory; build-gpu), NO_BUILD=1 (use BUILD as it is), CHECKS (lines
# "TEST_BINARY CATCH_FILTER"; default the model's GPU product and kernel
# tests: a failed GeluMlp, LayerNorm, Linear or cross-entropy check sets
# OB_LT_GELU=0, OB_LN_KERNEL=0, OB_GEMM_ACCUMULATE=0 or OB_FUSED_LOSS=0 for
# the runs), NCCL_MODELS ("gpt-tiny llama-tiny"), NCCL_PARTS_<model>
# (gpt-tiny: "pp kill tp stall", others: "pp tp"; a - for _ and . in the
# name), MFU_RUNS ("gpt2-large:8:32 llama3.2-1b:8:32 gpt2-medium:8:32"; on
# cpu "gpt-tiny:4:8 llama-tiny:4:8"), SEQ (1024; cpu 32), STEPS (30), SKIP
# (10), COMPILE=0 (no torch.compile peer), KILL_MODEL (the first of
# MFU_RUNS), KILL_STEP (15), KILL=0, NCCL=0, MFU=0, UNIT=0 (leave a phase
# out), WIDE_MB and WIDE_GB (0: none; the first model again at a wider
# micro-batch).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/ob-gpu}
py=${PYTHON:-python3}
budget=${BUDGET:-530}
bd=${BUILD:-$root/build-gpu}
device=${DEVICE:-cuda}
if [ "$device" = cuda ]; then
  mfu_runs=${MFU_RUNS:-gpt2-large:8:32 llama3.2-1b:8:32 gpt2-medium:8:32}
  seq=${SEQ:-1024}
else  # the dry run: tiny models, sequences of 32 (their positions: 64)
  mfu_runs=${MFU_RUNS:-gpt-tiny:4:8 llama-tiny:4:8}
  seq=${SEQ:-32}
fi
nccl_models=${NCCL_MODELS:-gpt-tiny llama-tiny}
kill_model=${KILL_MODEL:-${mfu_runs%%:*}}
steps=${STEPS:-30} skip=${SKIP:-10} kill_step=${KILL_STEP:-15}
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
cd "$root" || exit 1
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
    timeout $(( $(left) - 200 )) cmake --build "$bd" -j "$jobs" -- -k 0 \
        ob-launch ob-launch-worker ob-profile ob-plan ob-watch ob-ckpt max_step > "$out/build.log" 2>&1 && built=1
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

# capped SECONDS: SECONDS, or less where less of the budget is left (a
# phase's commands end before the budget does).
capped() { local l; l=$(( $(left) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }

# --- NCCL: several ranks on the one GPU -------------------------------------
# bench/gpu_nccl.sh per model: real NCCL between local hosts sharing the GPU
# (OB_TEST_NCCL_HOSTS=1); its lines (one a part) go to the summary.
if [ "${NCCL:-1}" = 1 ] && [ $built = 1 ]; then
  for m in $nccl_models; do
    var=NCCL_PARTS_${m//[-.]/_}
    parts=${!var:-}
    [ -n "$parts" ] || { [ "$m" = gpt-tiny ] && parts="pp kill tp stall" || parts="pp tp"; }
    phase "nccl $m ($parts)" 45 || continue
    OB_BIN=$bin OB_SOURCE_DIR=$root DEVICE=$device MODEL=$m PARTS="$parts" \
      timeout "$(capped 240)" bash bench/gpu_nccl.sh > "$out/nccl-$m.txt" 2> "$out/nccl-$m.err"
    rc=$?
    while IFS= read -r line; do say "nccl $line"; done < "$out/nccl-$m.txt"
    say "nccl $m: exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
    [ $rc = 0 ] || tail -5 "$out/nccl-$m.err" | tee -a "$summary"
  done
fi

# --- ob on one GPU against the peers ------------------------------------------
work=/tmp/ob-gpu-work
rm -rf "$work"; mkdir -p "$work"
echo gpu0 > "$work/hosts.txt"
(umask 077; echo gpu-bench-secret-0123456789 > "$work/secret")
# ob_summary RUN: tokens/s, MFU (PaLM's and llm.c's counts), peak memory of
# rank 0 over steps >= SKIP; with --json FILE, those figures in FILE too.
ob_summary() {
  "$bin/ob-watch" --records json "$1.metrics" 2> /dev/null | "$py" -c '
import json, sys
skip, out = int(sys.argv[1]), sys.argv[2]; rows = []
for line in sys.stdin:
    r = json.loads(line)
    if r.get("heartbeat") or int(r.get("rank", 0)) != 0 or int(r.get("step", -1)) < skip:
        continue
    rows.append(r)
if not rows:
    print("no step records"); sys.exit()
med = lambda k: sorted(float(r.get(k, 0)) for r in rows)[len(rows) // 2]
tps, mfu, llmc = med("tokens_per_second"), med("mfu"), med("mfu_llmc")
sec = sum(float(r.get("step_seconds", 0)) for r in rows)
peak = max(float(r.get("peak_memory_bytes", 0)) for r in rows)
snaps = sorted(float(r.get("snapshot_seconds", 0)) for r in rows)
json.dump({"tokens_per_s": tps, "mfu": mfu, "mfu_llmc": llmc, "peak_memory_bytes": peak,
           "mean_step_s": sec / len(rows)}, open(out, "w"))
print(f"steps {skip}..{skip + len(rows) - 1}: median tokens/s {tps:.0f}, mean step {sec / len(rows):.4f} s, "
      f"median MFU {mfu:.3f} (llm.c count {llmc:.3f}), peak memory {peak / 2**30:.2f} GiB, "
      f"snapshot on the training thread {sum(snaps) / len(rows):.4f} s/step (median {snaps[len(snaps) // 2]:.4f}, "
      f"max {snaps[-1]:.4f})")
' "$skip" "$1.json"
}
# train NAME MODEL [ARGS...]: ob-launch on the plan of MODEL, STEPS steps.
train() {
  local name=$1 m=$2; shift 2
  timeout "$(capped 200)" "$bin/ob-launch" --rsh local --secret-file "$work/secret" --steps "$steps" \
    --device "$device" --run-dir "$work/$name" --metrics "$work/$name.metrics" "$@" \
    "$work/plan-$m.pb" "$work/hosts.txt" > "$out/$name.out" 2> "$out/$name.err"
  local rc=$?
  say "ob $name: exit $rc; $(grep -a 'trained' "$out/$name.err" | tail -1)"
  say "ob $name: $(grep -a -m1 -o 'the MLP.s cuBLASLt GELU epilogues.*' "$out/$name.err")"
  say "ob $name: $(ob_summary "$work/$name")"
  [ $rc = 0 ] || tail -5 "$out/$name.err" | tee -a "$summary"
  return $rc
}
# peer NAME MODEL MB GB [ARGS...]: one run of torch_loop.py, its summary line.
peer() {
  local name=$1 m=$2 b=$3 g=$4; shift 4
  env -u LD_LIBRARY_PATH timeout "$(capped 200)" "$py" bench/peers/torch_loop.py --model "$m" --micro-batch "$b" \
    --global-batch "$g" --seq-len "$seq" --steps "$steps" --skip "$skip" --device "$device" --precision bf16 \
    --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  say "$name: exit $rc; $(tail -1 "$out/$name.log")"
  return $rc
}
# profile_plan MODEL MB GB: a measured profile on the device (bf16) and a
# plan of one pipeline on the one host.
profile_plan() {
  local m=$1 b=$2 g=$3
  timeout "$(capped 120)" "$bin/ob-profile" --model "$m" --device "$device" --dtype bfloat16 --seq-len "$seq" \
      --warmup 1 -k 3 -b "$b" -o "$work/profile-$m.pb" 2> "$out/profile-$m.err" \
    && "$bin/ob-plan" --hosts "$work/hosts.txt" -g 1 -f 0 -B "$g" -b "$b" \
      -o "$work/plan-$m.pb" --explain "$work/profile-$m.pb" > "$out/plan-$m.txt" 2>&1
  local rc=$?
  "$bin/ob-profile" --table "$work/profile-$m.pb" > "$out/profile-$m.txt" 2>&1
  say "profile+plan $m: exit $rc; $(tail -n 2 "$out/profile-$m.err" | tr '\n' ' ') $(tail -n 2 "$out/plan-$m.txt" 2> /dev/null | tr '\n' ' ')"
  say "profile+plan $m: $(grep -h '^# one micro-batch' "$out/profile-$m.txt") | $(grep -h -A2 '^# nodes stages' "$out/plan-$m.txt" 2> /dev/null | tail -n 1 | tr -s ' ') | $(grep -h '^# predicted iteration' "$out/plan-$m.txt" 2> /dev/null)"
  return $rc
}

# kill_run MODEL B G: kill -9 of the worker at KILL_STEP of an ob run of
# MODEL's plan (made first where missing): kill to the next completed step.
kill_run() {
  local m=$1 b=$2 g=$3
  [ -s "$work/plan-$m.pb" ] || profile_plan "$m" "$b" "$g" || return 1
  (
    end=$(( $(date +%s) + 150 ))
    until [ "$("$bin/max_step" "$work/kill.metrics" 2> /dev/null || echo -1)" -ge "$kill_step" ]; do
      [ "$(date +%s)" -lt "$end" ] || exit 1
      sleep 0.05
    done
    pids=$(pgrep -x ob-worker-0 | tr '\n' ' ')
    echo "killing worker(s) $pids at $(date +%s%3N)"
    # shellcheck disable=SC2086
    kill -9 $pids
  ) > "$out/kill.killer" 2>&1 &
  train kill "$m" --precision bf16
  wait
  say "kill: $(cat "$out/kill.killer")"
  grep -a "recovered\|restart\|lost" "$work/kill/events.log" | head -5 | tee -a "$summary"
  # The steps around the kill, in the order they completed.
  "$bin/ob-watch" --records json "$work/kill.metrics" 2> /dev/null | "$py" -c '
import json, sys
k = int(sys.argv[1]); out = []
for line in sys.stdin:
    r = json.loads(line)
    if r.get("heartbeat") or int(r.get("rank", 0)) != 0: continue
    s = int(r.get("step", -1))
    if k - 3 <= s <= k + 10:
        out.append("%d:%.3f/%.3f" % (s, float(r.get("step_seconds", 0)), float(r.get("snapshot_seconds", 0))))
print("kill: step:seconds/snapshot-seconds around the kill: " + " ".join(out))
' "$kill_step" | tee -a "$summary"
}
killed=0
want_kill() { [ "${KILL:-1}" = 1 ] && [ $killed = 0 ] && [ $built = 1 ]; }

mkdir -p "$work/trace"
first=""
if [ "${MFU:-1}" = 1 ]; then
  for run in $mfu_runs; do
    IFS=: read -r m b g <<< "$run"
    [ -n "$first" ] || first=$m
    if [ $built = 1 ] && phase "ob $m $b x $g" 60 && profile_plan "$m" "$b" "$g"; then
      # The first model's run and its eager peer's traced over steps 20-21.
      if [ "$m" = "$first" ]; then
        OB_TRACE=$work/trace train "train-$m" "$m" --precision bf16
      else
        train "train-$m" "$m" --precision bf16
      fi
    fi
    if phase "eager peer $m" 40; then
      if [ "$m" = "$first" ]; then peer "peer-$m" "$m" "$b" "$g" --trace "$work/trace/peer.json"; else peer "peer-$m" "$m" "$b" "$g"; fi
    fi
    if [ "${COMPILE:-1}" = 1 ] && phase "torch.compile peer $m" 60; then peer "compiled-$m" "$m" "$b" "$g" --compile; fi
    # The recovery's time right after the first model (the kill model's
    # plan then exists), before the budget goes to the others.
    if want_kill && [ "$m" = "$kill_model" ] && phase "kill -9 at step $kill_step ($m)" 50; then
      killed=1
      kill_run "$m" "$b" "$g"
    fi
  done
fi
if want_kill && phase "kill -9 at step $kill_step ($kill_model)" 50; then
  killed=1
  kill_run "$kill_model" 8 32
fi
if [ -s "$work/trace/trace-rank-0.json" ] || [ -s "$work/trace/peer.json" ]; then
  args=()
  [ -s "$work/trace/trace-rank-0.json" ] && args+=("ob=$work/trace/trace-rank-0.json")
  [ -s "$work/trace/peer.json" ] && args+=("peer=$work/trace/peer.json")
  env -u LD_LIBRARY_PATH timeout "$(capped 60)" "$py" bench/trace_summary.py --steps 2 --json "$out/trace-summary.json" \
    "${args[@]}" > "$out/trace-summary.txt" 2>&1
  head -80 "$out/trace-summary.txt" | tee -a "$summary"
  for f in "$work"/trace/*.json; do gzip -c "$f" > "$out/$(basename "$f").gz"; done
fi

# --- the first model again at a wider micro-batch (WIDE_MB; 0: none) ---------
wide_mb=${WIDE_MB:-0} wide_gb=${WIDE_GB:-64}
if [ "$wide_mb" -gt 0 ] && [ -n "$first" ] && [ $built = 1 ] && phase "ob $first at micro-batch $wide_mb" 110; then
  profile_plan "$first" "$wide_mb" "$wide_gb" && train "train-$first-mb$wide_mb" "$first" --precision bf16
  if phase "eager peer $first at micro-batch $wide_mb" 40; then peer "peer-$first-mb$wide_mb" "$first" "$wide_mb" "$wide_gb"; fi
fi

# --- the unit tests: the rest of the build first --------------------------------
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

# --- the MFU phase's table ---------------------------------------------------
if [ "${MFU:-1}" = 1 ]; then
  "$py" - "$out" "$work" $mfu_runs <<'PY' | tee -a "$summary"
import json, os, sys
out = sys.argv[1]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
print("model b x B | ob tokens/s | ob MFU (PaLM / llm.c) | eager tokens/s, MFU | compiled tokens/s, MFU | ob/eager | ob/compiled")
for run in sys.argv[3:]:
    m, b, g = run.split(":")
    ob = load(os.path.join(sys.argv[2], f"train-{m}.json"))
    eager, comp = load(os.path.join(out, f"peer-{m}.json")), load(os.path.join(out, f"compiled-{m}.json"))
    cell = lambda r: f"{r['tokens_per_s']:.0f}, {100 * r['mfu']:.1f}%" if r else "-"
    ratio = lambda r: f"{ob['tokens_per_s'] / r['tokens_per_s']:.2f}x" if ob and r and r["tokens_per_s"] > 0 else "-"
    obc = f"{ob['tokens_per_s']:.0f}" if ob else "-"
    obm = f"{100 * ob['mfu']:.1f}% / {100 * ob['mfu_llmc']:.1f}%" if ob else "-"
    print(f"{m} {b} x {g} | {obc} | {obm} | {cell(eager)} | {cell(comp)} | {ratio(eager)} | {ratio(comp)}")
PY
fi

say "done"
