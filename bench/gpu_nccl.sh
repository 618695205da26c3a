#!/usr/bin/env bash
# bench/gpu.sh's NCCL phase for one model (issue 58): real NCCL between
# several ranks on the one lent GPU. Every "host" is local (--rsh local) and,
# with OB_TEST_NCCL_HOSTS=1, every worker is a host of its own to NCCL over
# sockets (ob-launch(1), "--device"), so 4 processes share the GPU. In bf16,
# sequence 32, the fixed corpus, STEPS steps (40):
#  pp     2 pipelines x 2 stages (4 hosts) against one worker on the same
#         device: step 0's loss within 1e-3 relative, the last ten steps'
#         mean within TOL (bf16 training is chaotic: a spike of one run is
#         not the other's, so no per-step bound; fp32 runs of two layouts
#         agree to 1e-4 at every step, tests/process/launch_llama.sh); the 4
#         workers' NCCL_HOSTID differ (read from their environments while
#         they train);
#  kill   the same layout, f = 1; kill -9 of host h2 (its agent, worker and
#         standbys) at step KILL_AT (20): the survivors' communicators are
#         torn down and rebuilt, the lost stage's state comes from its
#         replica's snapshots (source=snapshots), within that tolerance of
#         the uninterrupted 2 x 2 run;
#  tp     one host, 2 slots given the one GPU (OB_GPUS_PER_HOST=2
#         CUDA_VISIBLE_DEVICES=0,0 on CUDA), a tp-2 pipeline: within that
#         tolerance of one worker;
#  stall  the 2 x 2 layout, rank 1 stalls in step KILL_AT (--inject
#         1:stall=K: its loop stops, its process and heartbeat go on, its
#         peers block inside NCCL): named within 5 s, the generation torn
#         down by SIGKILL (no wait for NCCL's watchdog), restarted in place,
#         within that tolerance of the uninterrupted run;
# after each, no process of the run is left. One line per part on stdout
# ("MODEL PART: ok ..." or "MODEL PART: FAIL ..."); exit 0 only when every
# part asked for passed.
#
# Environment: OB_BIN (the tools), OB_SOURCE_DIR, DEVICE (cuda; cpu: Gloo,
# the dry run), MODEL (gpt-tiny), PARTS ("pp kill tp stall"), STEPS (40),
# KILL_AT (20), TOL (2e-2).
NAME=gpu_nccl
source "$(dirname "$0")/../tests/lib/launch.sh"
DEVICE=${DEVICE:-cuda} MODEL=${MODEL:-gpt-tiny} PARTS=${PARTS:-pp kill tp stall}
STEPS=${STEPS:-40} KILL_AT=${KILL_AT:-20} TOL=${TOL:-2e-2}
export OB_TEST_NCCL_HOSTS=1
RUN_FLAGS=(--device "$DEVICE" --precision bf16)
failed=0
# part_fail PART WHY: reports, and goes on to the next part (after killing
# what the part left).
part_fail() {
  echo "$MODEL $1: FAIL: $2"
  failed=1
  [ -n "$MASTER_PID" ] && { kill -9 "$MASTER_PID" 2> /dev/null; wait "$MASTER_PID" 2> /dev/null; MASTER_PID=""; }
  local p
  for p in $(tagged); do kill -9 "$p" 2> /dev/null; done
}
# The runtime line of a worker: which device and backend really ran.
backend() { grep -a -m1 -o "device [a-z]*[^,]*, backend [a-z]*" "$WORK/$1.err" || echo "no runtime line"; }

"$OB_BIN/ob-profile" --model "$MODEL" --analytic --gpu h100 --dtype bfloat16 --seq-len 32 -b 1,4 -q \
  -o "$WORK/tiny.pb" || fail "ob-profile $MODEL"
(umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
# One micro-batch size for every layout (4), so that two layouts differ only
# in where sums are made: bf16's rounding, not another batch shape.
plan_hosts p-one h0 -- -g 1 -f 0 -b 4 --gpu-memory 0.1
plan_hosts p-pp h1 h2 h3 h4 -- -g 1 -f 1 -b 4 --gpu-memory 0.01
plan_hosts p-tp "h1 slots=2" -- -g 2 --tp 2 -f 0 -b 4 --gpu-memory 0.1
python3 - "$WORK/p-pp.json" "$WORK/p-tp.json" <<'PY' || fail "$MODEL: not the layouts this phase is about"
import json, sys
pp, tp = (json.load(open(p)) for p in sys.argv[1:3])
assert [x["template_nodes"] for x in pp["instantiation"]["pipelines"]] == [2, 2], pp["instantiation"]
assert all(s["tensor_parallel"] == 2 for t in tp["templates"] for s in t["stages"]), tp["templates"]
PY

# The reference: one worker, same device, precision and corpus.
RUN_PLAN="$WORK/p-one.pb" RUN_HOSTS="$WORK/p-one.hosts" run_start ref "$STEPS" --standby off "${RUN_FLAGS[@]}"
run_wait
if [ "$RC" != 0 ] || ! python3 "$METRICS_PY" check "$WORK/ref.pb" "$STEPS" 1 > /dev/null; then
  echo "$MODEL ref: FAIL: one worker: exit $RC: $(tail -3 "$WORK/ref.err")"
  exit 1
fi
echo "$MODEL ref: ok: one worker, $(backend ref), $(python3 "$METRICS_PY" check "$WORK/ref.pb" "$STEPS" 1)"

# compare_to REF RUN: RUN's losses against REF's within bf16's tolerance
# (tests/lib/metrics.py compare-bf16: step 0 within 1e-3, the last ten
# steps' mean within TOL); the figures in $WORK/RUN.cmp.
compare_to() {
  python3 "$METRICS_PY" compare-bf16 "$WORK/$1.pb" "$WORK/$2.pb" 1e-3 "$TOL" > "$WORK/$2.cmp" 2>&1
}
# hostids: the NCCL_HOSTID of every worker of this test now running (a
# worker names itself ob-worker-RANK; one forked from the seed shows the
# environment the seed gave it).
hostids() {
  local p
  for p in $(pgrep '^ob-worker-[0-9]+$'); do
    grep -qsa "OB_HOST=$TAG" "/proc/$p/environ" && tr '\0' '\n' < "/proc/$p/environ" | sed -n 's/^NCCL_HOSTID=//p'
  done | sort
}

# layout_run PART WORKERS WHAT: PART's plan ($WORK/p-PART.pb) trained STEPS
# steps without standbys: the NCCL_HOSTID of its WORKERS workers, read while
# they train, all different; within bf16's tolerance of one worker's run.
layout_run() {
  local part=$1 n=$2 what=$3 ids=""
  RUN_PLAN="$WORK/p-$part.pb" RUN_HOSTS="$WORK/p-$part.hosts" run_start "$part" "$STEPS" --standby off "${RUN_FLAGS[@]}"
  if wait_step "$part" 2; then ids=$(hostids); fi
  run_wait
  if [ "$RC" != 0 ]; then part_fail "$part" "exit $RC: $(tail -3 "$WORK/$part.err")"; return; fi
  if [ "$(sort -u <<< "$ids" | grep -c .)" != "$n" ]; then
    part_fail "$part" "the $n workers' NCCL_HOSTID are not $n different ones: $(echo $ids)"; return
  fi
  compare_to ref "$part" || { part_fail "$part" "against one worker: $(cat "$WORK/$part.cmp")"; return; }
  wait_for 5 no_tagged || { part_fail "$part" "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"; return; }
  echo "$MODEL $part: ok: $what against one worker: $(cat "$WORK/$part.cmp"); $(backend "$part"); NCCL_HOSTID $(echo $ids)"
}

for part in $PARTS; do
  case $part in
  pp) layout_run pp 4 "2 x 2" ;;
  kill)
    [ -s "$WORK/pp.pb" ] || { part_fail kill "needs the pp part's run"; continue; }
    RUN_PLAN="$WORK/p-pp.pb" RUN_HOSTS="$WORK/p-pp.hosts" run_start kill "$STEPS" "${RUN_FLAGS[@]}"
    if ! wait_step kill "$KILL_AT"; then part_fail kill "did not reach step $KILL_AT: $(tail -3 "$WORK/kill.err")"; continue; fi
    victims=$(host_pids "${TAG}h2")
    # shellcheck disable=SC2086
    [ -n "$victims" ] && kill -9 $victims
    run_wait
    rec=$(grep -a " recovered generation=2 " "$WORK/kill/events.log")
    start=$(grep -a " start-workers generation=2 " "$WORK/kill/events.log")
    if [ "$RC" != 0 ]; then part_fail kill "exit $RC: $(tail -3 "$WORK/kill.err")"; continue; fi
    [ -n "$rec" ] || { part_fail kill "no recovery logged"; continue; }
    [[ "$start" =~ " source=snapshots " ]] || { part_fail kill "generation 2 not from the replicas' snapshots: $start"; continue; }
    compare_to pp kill || { part_fail kill "against the uninterrupted run: $(cat "$WORK/kill.cmp")"; continue; }
    wait_for 5 no_tagged || { part_fail kill "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"; continue; }
    echo "$MODEL kill: ok: kill -9 of h2 at step $KILL_AT: $(cat "$WORK/kill.cmp"); ${rec#* recovered }"
    ;;
  tp)
    env_tp=()
    [ "$DEVICE" = cuda ] && env_tp=(env OB_GPUS_PER_HOST=2 CUDA_VISIBLE_DEVICES=0,0)
    RUN_WRAP="${env_tp[*]}" layout_run tp 2 "tp 2 on one host"
    ;;
  stall)
    [ -s "$WORK/pp.pb" ] || { part_fail stall "needs the pp part's run"; continue; }
    RUN_PLAN="$WORK/p-pp.pb" RUN_HOSTS="$WORK/p-pp.hosts" run_start stall "$STEPS" --inject "1:stall=$KILL_AT" "${RUN_FLAGS[@]}"
    injected() { grep -q "fault injection: stalling in step $KILL_AT" "$WORK/stall.err"; }
    injected_or_gone() { injected || ! kill -0 "$MASTER_PID" 2> /dev/null; }
    if ! { wait_for 120 injected_or_gone && injected; }; then part_fail stall "rank 1 never stalled: $(tail -3 "$WORK/stall.err")"; continue; fi
    t0=$(now_ms)
    detected() { grep -q " detect worker rank 1 on host .* hung: " "$WORK/stall/events.log"; }
    if ! wait_for 10 detected; then part_fail stall "no hang of rank 1 reported within 10 s"; continue; fi
    latency=$(( $(now_ms) - t0 ))
    run_wait
    rec=$(grep -a " recovered generation=2 " "$WORK/stall/events.log")
    if [ "$RC" != 0 ]; then part_fail stall "exit $RC: $(tail -3 "$WORK/stall.err")"; continue; fi
    [ "$latency" -le 5000 ] || { part_fail stall "the hang was found $latency ms after the stall (> 5 s)"; continue; }
    [ -n "$rec" ] || { part_fail stall "no recovery logged"; continue; }
    # Torn down by SIGKILL, not by NCCL's watchdog (minutes): the
    # teardown phase of the recovery is bounded by the agents' kills.
    [[ "$rec" =~ " teardown_ms="([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -le 10000 ] \
      || { part_fail stall "teardown not within 10 s: $rec"; continue; }
    compare_to pp stall || { part_fail stall "against the uninterrupted run: $(cat "$WORK/stall.cmp")"; continue; }
    wait_for 5 no_tagged || { part_fail stall "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"; continue; }
    echo "$MODEL stall: ok: found $latency ms after the stall; $(cat "$WORK/stall.cmp"); ${rec#* recovered }"
    ;;
  *) part_fail "$part" "no such part (pp kill tp stall)" ;;
  esac
done
exit $failed
