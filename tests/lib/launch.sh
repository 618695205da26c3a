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
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"

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
  # OB_TEST_KEEP=1 keeps the work directory (logs, events, metrics) to read.
  if [ -n "${OB_TEST_KEEP:-}" ]; then echo "$NAME: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# make_cluster N: $WORK/hosts.txt with N hosts ${TAG}h1.., $WORK/plan.pb, $WORK/secret.
make_cluster() {
  local n=$1 i
  : > "$WORK/hosts.txt"
  for ((i = 1; i <= n; i++)); do echo "${TAG}h$i" >> "$WORK/hosts.txt"; done
  # An fp32 profile: the workers train on the CPU, in fp32 by default, and
  # ob-launch refuses a plan made for another precision.
  "$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 64 -q \
    -o "$WORK/cluster-profile.pb" || fail "ob-profile"
  "$OB_BIN/ob-plan" --hosts "$WORK/hosts.txt" -g 1 -f 1 -B 8 -o "$WORK/plan.pb" \
    "$WORK/cluster-profile.pb" || fail "ob-plan"
  (umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
}

# wait_for SECONDS CMD...: polls CMD every 0.05 s; false after SECONDS.
# (The clock is bash's own: a `date` per poll is two processes.)
wait_for() {
  local end=$(( ${EPOCHREALTIME/[.,]/} + ${1%.*} * 1000000 )); shift
  until "$@"; do
    [ "${EPOCHREALTIME/[.,]/}" -lt "$end" ] || return 1
    sleep 0.05
  done
}

count_tagged() { tagged | grep -c . ; }
no_tagged() { [ "$(count_tagged)" = 0 ]; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Worker processes of this test now running (found by OB_HOST; a standby
# worker, which has no rank yet, does not count).
count_workers() {
  grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ | xargs -r grep -lsa "OB_RANK=" | grep -c .
}

# stand_in_start RUN [FLAGS...]: ob-launch on $WORK/plan.pb and
# $WORK/hosts.txt with stand-in workers (sleep 60), in the background: run
# directory $WORK/RUN, stderr $WORK/RUN.err; returns once every host's
# worker runs. Sets MASTER_PID (the `timeout` wrapper; master_process is
# ob-launch itself).
# stand_in_launch RUN [FLAGS...]: the same, without waiting for the
# workers; through --rsh $STAND_IN_RSH (default local), for at most
# $STAND_IN_TIMEOUT s (default 30). $STAND_IN_CMD replaces the stand-ins'
# shell command.
stand_in_launch() {
  local run=$1
  shift
  OB_TEST_WORKER_CMD="${STAND_IN_CMD:-exec sleep 60}" timeout "${STAND_IN_TIMEOUT:-30}" "$OB_BIN/ob-launch" \
    --rsh "${STAND_IN_RSH:-local}" --secret-file "$WORK/secret" --run-dir "$WORK/$run" "$@" \
    "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/$run.err" &
  MASTER_PID=$!
}
stand_in_start() {
  local run=$1
  shift
  stand_in_launch "$run" "$@"
  local hosts
  hosts=$(grep -c . "$WORK/hosts.txt")
  stand_ins_up() { grep -q start-workers "$WORK/$run/events.log" 2>/dev/null && [ "$(count_workers)" -ge "$hosts" ]; }
  wait_for 10 stand_ins_up || fail "$run: workers did not start: $(tail -3 "$WORK/$run.err")"
}
master_process() { pgrep -P "$MASTER_PID" -f ob-launch | head -1; }
# stop_master RUN: SIGTERM to the master of RUN, which must exit 0 and
# leave no process behind.
stop_master() {
  kill -TERM "$(master_process)"
  wait "$MASTER_PID"
  local rc=$?
  MASTER_PID=""
  [ "$rc" = 0 ] || fail "$1: SIGTERM: exit $rc, expected 0: $(tail -3 "$WORK/$1.err")"
  wait_for 3 no_tagged || fail "$1: processes left after SIGTERM: $(tagged | xargs -r ps -o pid,args -p)"
}

# make_pipelines N F: N hosts, gpt-tiny (sequence 32) planned with f = F on
# GPUs so small that n0 = 2: N/2 pipelines of two stages, so stages talk
# across processes. $WORK/plan.pb, $WORK/plan.json, $WORK/hosts.txt,
# $WORK/secret. make_two_by_two: make_pipelines 4 1. PLAN_DTYPE (default
# float32) is the profile's, hence the plan's, precision.
make_pipelines() {
  local n=$1 f=$2 i
  "$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype "${PLAN_DTYPE:-float32}" \
    --seq-len 32 -o "$WORK/tiny.pb" || fail "ob-profile"
  : > "$WORK/hosts.txt"
  for ((i = 1; i <= n; i++)); do echo "${TAG}h$i" >> "$WORK/hosts.txt"; done
  (umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
  local flags=(--hosts "$WORK/hosts.txt" -g 1 -f "$f" -B 8 --gpu-memory 0.012 --overhead-gib 0)
  "$OB_BIN/ob-plan" "${flags[@]}" --json "$WORK/tiny.pb" > "$WORK/plan.json" || fail "ob-plan"
  "$OB_BIN/ob-plan" "${flags[@]}" -o "$WORK/plan.pb" "$WORK/tiny.pb" || fail "ob-plan"
  python3 - "$WORK/plan.json" "$n" <<'PY' || fail "the plan is not $((n / 2)) pipelines of 2 stages"
import json, sys
p = json.load(open(sys.argv[1]))
want = [2] * (int(sys.argv[2]) // 2)
assert [x["template_nodes"] for x in p["instantiation"]["pipelines"]] == want, p["instantiation"]
PY
}
make_two_by_two() { make_pipelines 4 1; }

# plan_hosts NAME HOSTS... -- OB-PLAN FLAGS: $WORK/NAME.pb, NAME.hosts and
# NAME.json, planned from $WORK/tiny.pb for local hosts "HOST slots=N" (the
# names get this test's tag), -B 8 and no overhead.
plan_hosts() {
  local name=$1
  shift
  : > "$WORK/$name.hosts"
  while [ "$1" != "--" ]; do echo "${TAG}$1" >> "$WORK/$name.hosts"; shift; done
  shift
  local flags=(--hosts "$WORK/$name.hosts" -B 8 --overhead-gib 0 "$@")
  "$OB_BIN/ob-plan" "${flags[@]}" -o "$WORK/$name.pb" "$WORK/tiny.pb" || fail "ob-plan $name"
  "$OB_BIN/ob-plan" "${flags[@]}" --json "$WORK/tiny.pb" > "$WORK/$name.json" || fail "ob-plan --json $name"
}

METRICS_PY="$OB_SOURCE_DIR/tests/lib/metrics.py"

# run_start RUN STEPS [FLAGS...]: trains $WORK/plan.pb on $WORK/hosts.txt (or
# $RUN_PLAN on $RUN_HOSTS; the fixed corpus, or $RUN_DATA) in the background: run directory $WORK/RUN, metrics
# $WORK/RUN.pb, stderr $WORK/RUN.err; sets MASTER_PID. $RUN_WRAP: a command
# that execs the master (e.g. nohup).
run_start() {
  local run=$1 steps=$2
  shift 2
  rm -rf "${WORK:?}/$run" "$WORK/$run.pb"
  timeout 240 ${RUN_WRAP:-} "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/$run" \
    --steps "$steps" --data "${RUN_DATA:-$OB_SOURCE_DIR/tests/data/corpus.txt}" --metrics "$WORK/$run.pb" "$@" \
    "${RUN_PLAN:-$WORK/plan.pb}" "${RUN_HOSTS:-$WORK/hosts.txt}" 2> "$WORK/$run.err" &
  MASTER_PID=$!
}
# reference_run STEPS: an uninterrupted run "ref" of STEPS steps that must
# succeed, to compare others with ($WORK/ref.pb); RUN_RANKS: its ranks
# (default: one a host). Nothing fails in it, so it keeps no standby
# workers (half of the processes that load LibTorch, on two busy cores).
reference_run() {
  run_start ref "$1" --standby off
  run_wait
  [ "$RC" = 0 ] || fail "uninterrupted run: exit $RC: $(tail -3 "$WORK/ref.err")"
  python3 "$METRICS_PY" check "$WORK/ref.pb" "$1" "${RUN_RANKS:-$(grep -c . "${RUN_HOSTS:-$WORK/hosts.txt}")}" \
    > /dev/null || fail "uninterrupted run's metrics"
}
# run_wait: waits for the master; RC is its exit status.
run_wait() { wait "$MASTER_PID"; RC=$?; MASTER_PID=""; }
# run_resumed RUN PLAN HOSTS STEPS CHECKPOINT REF REL: run RUN of PLAN on
# HOSTS (--standby off) resumed from CHECKPOINT, to step STEPS; fails
# unless it exits 0 and every loss it reports equals the metrics file
# REF's within REL relative. Sets RESUMED to the comparison's line.
run_resumed() {
  local run=$1 plan=$2 hosts=$3 steps=$4 checkpoint=$5 ref=$6 rel=$7
  RUN_PLAN="$plan" RUN_HOSTS="$hosts" run_start "$run" "$steps" --standby off --resume "$checkpoint"
  run_wait
  [ "$RC" = 0 ] || fail "$run, resumed from $checkpoint: exit $RC: $(tail -3 "$WORK/$run.err")"
  python3 "$METRICS_PY" compare "$WORK/$run.pb" "$ref" "$rel" > "$WORK/$run.cmp" \
    || fail "$run, resumed from $checkpoint: $(cat "$WORK/$run.cmp")"
  RESUMED=$(cat "$WORK/$run.cmp")
}
# max_step FILE: metrics.py max-step, compiled (tests/tools/max_step.cc):
# wait_step runs it 20 times a second while the workers under test train.
max_step() { if [ -s "$1" ]; then "$OB_BIN/max_step" "$1"; else echo -1; fi; }
# wait_step RUN N: until a rank reported step N; false after 90 s or when
# the master is gone.
wait_step() {
  local end=$(( EPOCHSECONDS + 90 ))
  while [ "$(max_step "$WORK/$1.pb")" -lt "$2" ]; do
    kill -0 "$MASTER_PID" 2>/dev/null || return 1
    [ "$EPOCHSECONDS" -lt "$end" ] || return 1
    sleep 0.05
  done
}
# control SOCKET LINE: one request on a master's control socket; prints
# its one-line JSON answer.
control() {
  python3 - "$1" "$2" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile().readline().strip())
PY
}
# host_pids HOST: its agent, and every worker and standby it started.
host_pids() {
  { pgrep -f -- "--agent .*--host $1( |\$)"; grep -lsa "OB_HOST=$1\b" /proc/[0-9]*/environ | cut -d/ -f3; } \
    | sort -u
}
# kill_host_at RUN STEP HOST: once a rank of RUN reported STEP, kill -9 of
# HOST's agent and every worker and standby it started; then waits for the
# master (RC).
kill_host_at() {
  local run=$1 step=$2 host=$3 victims
  wait_step "$run" "$step" || fail "$run did not reach step $step: $(tail -3 "$WORK/$run.err")"
  victims=$(host_pids "$host")
  [ -n "$victims" ] || fail "no processes for $host"
  # shellcheck disable=SC2086
  kill -9 $victims
  run_wait
}
# check_recovered RUN STEPS WHAT: RUN exited 0 after STEPS steps, recovered
# in place once (generation 2, from the survivors' snapshots, every phase
# logged), every loss the reference's ($WORK/ref.pb) within 1e-4, nothing
# left behind; prints the comparison and the phases.
check_recovered() {
  local run=$1 steps=$2 what=$3 rec start phase
  [ "$RC" = 0 ] || fail "$what: exit $RC: $(tail -3 "$WORK/$run.err")"
  grep -q "trained $steps steps: final loss" "$WORK/$run.err" || fail "$what: no closing line"
  rec=$(grep " recovered generation=2 " "$WORK/$run/events.log") || fail "$what: no recovery logged"
  for phase in detect decide teardown regroup copy first_step total; do
    [[ "$rec" =~ " ${phase}_ms="[0-9]+ ]] || fail "$what: no $phase phase in: $rec"
  done
  start=$(grep " start-workers generation=2 " "$WORK/$run/events.log")
  [[ "$start" =~ " source=snapshots " ]] || fail "$what: generation 2 did not start from snapshots: $start"
  python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/$run.pb" 1e-4 > "$WORK/$run.cmp" \
    || fail "$what: $(cat "$WORK/$run.cmp")"
  wait_for 3 no_tagged || fail "$what: processes left behind: $(tagged)"
  echo "$NAME: $what: $(cat "$WORK/$run.cmp"); ${rec#* recovered }"
}
# worker_pid RANK: this test's worker process of that rank (named ob-worker-RANK).
worker_pid() {
  local p
  for p in $(pgrep -x "ob-worker-$1"); do
    grep -qsa "OB_HOST=$TAG" "/proc/$p/environ" && { echo "$p"; return; }
  done
}
