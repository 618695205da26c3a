#!/usr/bin/env bash
# ob-launch against its peers in one run: PyTorch DDP over Gloo under torchrun
# (bench/peers/ddp_gpt.py), same model (gpt-tiny), data, global batch (16
# sequences of 64 tokens), micro-batch (1), process count (4, as
# scripts/quickstart), fp32 and one intra-op thread per process.
#
#   bench/peers.sh [STEPS] [ROUNDS] [RECOVERY_RUNS]   (default 100 3 5)
#
# Throughput: ROUNDS alternating runs of each; steady-state tokens/s from rank
# 0's step-completion wall clock over steps WARMUP..STEPS-1 (start-up and the
# first WARMUP steps excluded, the same rule for both); medians.
# Recovery: RECOVERY_RUNS runs of each; at step KILL_STEP one host is killed
# with SIGKILL (ob-launch: the agent of host 1 and its worker; torchrun: local
# rank 1's worker, torchrun --max_restarts 3 resuming from a torch.save
# checkpoint written every 10 steps). Recovery time = kill -> the next
# completed training step: ob's `recovered` line in RUN_DIR/events.log, or the
# first step a restarted DDP worker completes; medians.
#
# Environment: OB_BIN (default build/bin), PYTHON (a python3 with torch;
# default /usr/bin/python3, Debian's python3-torch), DATA (a text file, its
# bytes the tokens; default README.md, as scripts/quickstart),
# WARMUP (10), KILL_STEP (50), MONITOR_INTERVAL (torchrun's
# --monitor_interval; default: torchrun's own, 5 s), WORK (scratch directory;
# default a new one under /tmp, removed at the end unless KEEP=1).
set -euo pipefail

source "$(dirname "$0")/lib.sh"
bench_paths
py=${PYTHON:-/usr/bin/python3}
data=${DATA:-$root/README.md}
steps=${1:-100}
rounds=${2:-3}
recovery_runs=${3:-5}
warmup=${WARMUP:-10}
kill_step=${KILL_STEP:-50}
monitor=${MONITOR_INTERVAL:-}
keep=${KEEP:-0}
tokens_per_step=$((16 * 64))  # the plan's global batch x gpt-tiny's sequence

die() { echo "peers.sh: $*" >&2; exit 1; }

bench_need ob-profile ob-plan ob-launch
if ! "$py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  die "$py cannot import torch with Gloo; install Debian's PyTorch with
  apt-get install -y python3-torch
(or set PYTHON to a python3 that has torch)"
fi
[ -r "$data" ] || die "$data: cannot read"
[ "$kill_step" -lt "$steps" ] || die "KILL_STEP $kill_step must be below STEPS $steps"
[ "$warmup" -lt "$((steps - 1))" ] || die "WARMUP $warmup leaves no steady-state steps"

work=${WORK:-$(mktemp -d /tmp/ob-peers.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
tag="pb$$"  # every process we start carries PEERS_TAG=$tag in its environment
# Both read one copy, so an edit of the file during the bench changes neither;
# named .txt so that ob-launch reads bytes as tokens, as ddp_gpt.py does.
data_name=$(basename "$data")
cp "$data" "$work/data.txt"
data=$work/data.txt

# Kills, by pid, every process whose environment holds PEERS_TAG=$tag: the
# ob-launch master, agents (own process groups) and workers, torchrun and
# its workers. Nothing else carries the tag.
with_env() {  # VAR=VALUE: pids of the processes whose environment holds it
  grep -lzx -- "$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
}
kill_tagged() {
  local p
  for p in $(with_env "PEERS_TAG=$tag"); do
    [ "$p" = "$$" ] || kill -9 "$p" 2>/dev/null || true
  done
}
cleanup() {
  kill_tagged
  if [ "$keep" = 1 ]; then echo "# files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- helpers in Python (metrics decoding, polling, figures) ------------------
cat > "$work/peers_tool.py" <<'EOF'
"""Reads ob's delimited Metrics records and ddp_gpt.py's step logs."""
import glob, os, statistics, struct, sys, time

def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7F) << shift; shift += 7
        if c < 0x80: return v, i

def metrics(b):
    """(fields, end offset) of each whole ob.pb.Metrics record in bytes b:
    3 rank, 6 step, 8 unix_ms, 9 step_seconds, 13 loss, 17 heartbeat."""
    i = 0
    while i < len(b):
        try:
            n, j = varint(b, i)
        except IndexError:
            return
        if j + n > len(b): return  # a record still being written
        f, k = {}, j
        while k < j + n:
            key, k = varint(b, k)
            num, wt = key >> 3, key & 7
            if wt == 0: f[num], k = varint(b, k)
            elif wt == 1: f[num] = struct.unpack_from("<d", b, k)[0]; k += 8
            elif wt == 2: ln, k = varint(b, k); f[num] = None; k += ln  # present, not decoded
            elif wt == 5: k += 4
            else: break
        i = j + n
        if f.get(3, 0) == 0 and not f.get(17, 0) and 26 not in f: yield f, i  # steps: no heartbeats, no exit records

def ob_steps(path):
    """(step, unix_ms, step_seconds, loss) of rank 0's completed steps."""
    try:
        b = open(path, "rb").read()
    except OSError:
        return []
    return [(f.get(6, 0), f.get(8, 0), f.get(9, 0.0), f.get(13, float("nan")))
            for f, _ in metrics(b)]

def ddp_lines(log_dir):
    """Every `step=` line of every rank's log, as dicts."""
    rows = []
    for path in glob.glob(os.path.join(log_dir, "rank*.log")):
        with open(path) as fh:
            for line in fh:
                if not line.startswith("step="): continue
                kv = dict(w.split("=", 1) for w in line.split())
                kv["rank"] = os.path.basename(path)[4:-4]
                rows.append(kv)
    return rows

def ddp_steps(log_dir):
    """The same for rank 0 of the first start (no restart)."""
    return sorted((int(r["step"]), int(r["unix_ms"]), float(r["step_s"]), float(r["loss"]))
                  for r in ddp_lines(log_dir) if r["rank"] == "0" and r["restart"] == "0")

_seen = {}  # file -> (bytes decoded, last step): polls read only what is new

def last_step(kind, src):
    path = src if kind == "ob" else os.path.join(src, "rank0.log")
    done, last = _seen.get(path, (0, -1))
    try:
        with open(path, "rb") as fh:
            fh.seek(done)
            b = fh.read()
    except OSError:
        return last
    used = 0
    if kind == "ob":
        for f, used in metrics(b):
            last = max(last, f.get(6, 0))
    else:
        used = b.rfind(b"\n") + 1
        for line in b[:used].decode().splitlines():
            if line.startswith("step="): last = max(last, int(line.split()[0][5:]))
    _seen[path] = (done + used, last)
    return last

def cmd_wait(kind, src, step, pid, timeout):
    """Exit 0 once rank 0 has completed `step`; 1 if process `pid` ends
    first or after `timeout` seconds."""
    deadline = time.time() + float(timeout)
    while time.time() < deadline:
        if last_step(kind, src) >= int(step): return 0
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return 1
        time.sleep(0.02)
    return 1

def cmd_rate(kind, src, warmup, tokens):
    """tokens/s over steps warmup..last from rank 0's wall clock (whole span,
    and per step: the median interval between step ends) and from the steps'
    own timers; then the step count, first and last loss."""
    s = sorted(ob_steps(src) if kind == "ob" else ddp_steps(src))
    warmup, tokens = int(warmup), int(tokens)
    steady = [r for r in s if r[0] >= warmup]
    if len(steady) < 3:
        print("-", "-", "-", len(s), "-", "-"); return 1
    span_s = (steady[-1][1] - steady[0][1]) / 1e3
    wall = tokens * (steady[-1][0] - steady[0][0]) / span_s
    gaps = [(b[1] - a[1]) / 1e3 for a, b in zip(steady, steady[1:]) if b[0] == a[0] + 1]
    p50 = tokens / statistics.median(gaps)
    timer = tokens * len(steady[1:]) / sum(r[2] for r in steady[1:])
    print(f"{wall:.0f} {p50:.0f} {timer:.0f} {len(s)} {s[0][3]:.4f} {s[-1][3]:.4f}")
    return 0

def cmd_ddp_recovered(log_dir, kill_ms):
    """ms from the kill to the first step a restarted worker completed, that
    step, and ms from the kill to the last restarted worker's `start` line
    (interpreter, imports, process group and checkpoint loaded)."""
    rows = [r for r in ddp_lines(log_dir) if int(r["restart"]) > 0]
    starts = []
    for path in glob.glob(os.path.join(log_dir, "rank*.log")):
        with open(path) as fh:
            starts += [int(w[8:]) for line in fh if line.startswith("start ")
                       and " restart=0 " not in line for w in line.split() if w.startswith("unix_ms=")]
    if not rows:
        print("- - -"); return 1
    first = min(rows, key=lambda r: int(r["unix_ms"]))
    ready = max(starts) - int(kill_ms) if starts else "-"
    print(int(first["unix_ms"]) - int(kill_ms), first["step"], ready)
    return 0

def cmd_median(*xs):
    xs = [float(x) for x in xs if x not in ("-", "")]
    print(f"{statistics.median(xs):.0f}" if xs else "-")
    return 0

def cmd_ratio(a, b):
    ok = a not in ("-", "") and b not in ("-", "") and float(b) != 0
    print(f"{float(a) / float(b):.2f}" if ok else "-")
    return 0

cmds = {"wait": cmd_wait, "rate": cmd_rate, "ddp-recovered": cmd_ddp_recovered,
        "median": cmd_median, "ratio": cmd_ratio}
sys.exit(cmds[sys.argv[1]](*sys.argv[2:]))
EOF
tool() { "$py" "$work/peers_tool.py" "$@"; }
now_ms() { date +%s%3N; }

# --- the ob side: profile, plan, secret --------------------------------------
cd "$work"
printf '%sn0\n%sn1\n%sn2\n%sn3\n' "$tag" "$tag" "$tag" "$tag" > hosts.txt
(umask 077; head -c 32 /dev/urandom | base64 > secret)
"$bin/ob-profile" --model gpt-tiny -q -o tiny.pb

# Every run gets its own host names (ob) or rendezvous id (torchrun). A plan
# names its hosts, so each ob run is planned for its own (milliseconds).
run_ob() {  # NAME STEPS: ob-launch in the background; sets ob_pid
  local name=$1 n=$2
  sed "s/^$tag/$tag$name/" hosts.txt > "hosts-$name.txt"
  "$bin/ob-plan" --hosts "hosts-$name.txt" -f 1 --global-batch 16 -q -o "plan-$name.pb" tiny.pb
  PEERS_TAG=$tag OMP_NUM_THREADS=1 "$bin/ob-launch" --rsh local --secret-file secret \
    --steps "$n" --data "$data" --run-dir "ob-$name" --metrics "ob-$name.metrics" \
    "plan-$name.pb" "hosts-$name.txt" > "ob-$name.out" 2>&1 &
  ob_pid=$!
}

free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

run_ddp() {  # NAME STEPS [ddp_gpt.py options...]: torchrun in the background; sets ddp_pid
  local name=$1 n=$2
  shift 2
  local extra=()
  [ -n "$monitor" ] && extra=(--monitor_interval "$monitor")
  # --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 cannot parse
  # their default "0" (Std.from_str returns None); 1 sends the workers'
  # (empty) stdout to files under tr-NAME.
  PEERS_TAG=$tag OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --nnodes 1 --nproc_per_node 4 \
    --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$(free_port)" --rdzv_id "$tag$name" \
    --max_restarts 3 "${extra[@]}" --log_dir "tr-$name" --redirects 1 --tee 1 \
    "$root/bench/peers/ddp_gpt.py" --data "$data" --steps "$n" --log-dir "ddp-$name" "$@" \
    > "ddp-$name.out" 2>&1 &
  ddp_pid=$!
}

wait_for() {  # PID SECONDS: exit status, or 124 after SECONDS
  local pid=$1 limit=$2 i=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
    if [ "$i" -ge $((limit * 10)) ]; then kill_tagged; wait "$pid" 2>/dev/null || true; return 124; fi
  done
  local rc=0
  wait "$pid" || rc=$?
  return "$rc"
}

warn=()
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  warn+=("the machine was not idle at the start (load average $load): figures are noisy")
fi
echo "# ob-launch vs PyTorch DDP (Gloo, torchrun): gpt-tiny, 4 processes, global batch 16 x 64 tokens,"
echo "#   micro-batch 1, fp32, OMP_NUM_THREADS=1; data $data_name ($(stat -c %s "$data") bytes); $steps steps"
echo "#   torch $("$py" -c 'import torch; print(torch.__version__)'), $(nproc) cores; $("$bin/ob-launch" --version)"
echo "#"

# --- throughput --------------------------------------------------------------
echo "# throughput: steady state over steps $warmup..$((steps - 1)), from rank 0's step-end wall clock:"
echo "#   wall = the whole span, p50 = the median step-to-step interval (robust to a busy machine),"
echo "#   timer = the steps' own timers (leave out the time between steps); ratio = ob / DDP"
fmt='%-7s %9s %9s %9s %9s %9s %9s %7s %7s\n'
# shellcheck disable=SC2059
printf "$fmt" "# round" "ob wall" "ob p50" "ob timer" "ddp wall" "ddp p50" "ddp timer" "ratio" "ratio"
# shellcheck disable=SC2059
printf "$fmt" "#" "(tok/s)" "(tok/s)" "(tok/s)" "(tok/s)" "(tok/s)" "(tok/s)" "(wall)" "(p50)"
cols=(ob_wall ob_p50 ob_timer ddp_wall ddp_p50 ddp_timer)
declare -A all
for r in $(seq 1 "$rounds"); do
  ob_wall=- ob_p50=- ob_timer=- ob_n=0 ob_first=- ob_last=-
  ddp_wall=- ddp_p50=- ddp_timer=- ddp_n=0 ddp_first=- ddp_last=-
  run_ob "t$r" "$steps"
  rc=0; wait_for "$ob_pid" 300 || rc=$?
  [ "$rc" = 0 ] || warn+=("ob-launch throughput run $r exited $rc (see ob-t$r.out)")
  ! grep -q ' detect ' "ob-t$r/events.log" 2>/dev/null ||
    warn+=("ob-launch throughput run $r detected a failure nobody caused (see ob-t$r/events.log)")
  read -r ob_wall ob_p50 ob_timer ob_n ob_first ob_last \
    < <(tool rate ob "ob-t$r.metrics" "$warmup" "$tokens_per_step" || true) || true
  run_ddp "t$r" "$steps"
  rc=0; wait_for "$ddp_pid" 300 || rc=$?
  [ "$rc" = 0 ] || warn+=("torchrun throughput run $r exited $rc (see ddp-t$r.out)")
  read -r ddp_wall ddp_p50 ddp_timer ddp_n ddp_first ddp_last \
    < <(tool rate ddp "ddp-t$r" "$warmup" "$tokens_per_step" || true) || true
  [ "$ob_n" = "$steps" ] || warn+=("ob-launch round $r: $ob_n of $steps steps in the metrics")
  [ "$ddp_n" = "$steps" ] || warn+=("torchrun round $r: $ddp_n of $steps steps in the logs")
  [ "$ob_first" = "$ddp_first" ] ||
    warn+=("round $r: first losses differ (ob $ob_first, DDP $ddp_first): not the same model and data?")
  for c in "${cols[@]}"; do all[$c]="${all[$c]:-} ${!c}"; done
  # shellcheck disable=SC2059
  printf "$fmt" "$r" "$ob_wall" "$ob_p50" "$ob_timer" "$ddp_wall" "$ddp_p50" "$ddp_timer" \
    "$(tool ratio "$ob_wall" "$ddp_wall")" "$(tool ratio "$ob_p50" "$ddp_p50")"
done
declare -A med
# shellcheck disable=SC2086
for c in "${cols[@]}"; do med[$c]=$(tool median ${all[$c]}); done
# shellcheck disable=SC2059
printf "$fmt" "median" "${med[ob_wall]}" "${med[ob_p50]}" "${med[ob_timer]}" "${med[ddp_wall]}" \
  "${med[ddp_p50]}" "${med[ddp_timer]}" "$(tool ratio "${med[ob_wall]}" "${med[ddp_wall]}")" \
  "$(tool ratio "${med[ob_p50]}" "${med[ddp_p50]}")"
echo "# loss, last round: first ob $ob_first / DDP $ddp_first, last ob $ob_last / DDP $ddp_last"
echo "#"

# --- recovery ----------------------------------------------------------------
echo "# recovery: SIGKILL at step $kill_step of $steps; kill -> next completed training step"
echo "#   ob-launch: host 1's agent and worker; in-place recovery (events.log 'recovered')"
echo "#   torchrun:  local rank 1's worker; --max_restarts 3, monitor interval ${monitor:-default (5 s)},"
echo "#              torch.save checkpoint every 10 steps, reload on restart"
echo "#   next = the first step completed after the kill; ddp ready = kill -> every restarted"
echo "#   worker has imported torch, joined its process group and loaded the checkpoint"
rfmt='%-7s %9s %9s %9s %9s %9s\n'
# shellcheck disable=SC2059
printf "$rfmt" "# run" "ob-launch" "ob next" "torchrun" "ddp ready" "ddp next"
# shellcheck disable=SC2059
printf "$rfmt" "#" "(ms)" "(step)" "(ms)" "(ms)" "(step)"
ob_recs=() ddp_recs=()
ob_note=""
for r in $(seq 1 "$recovery_runs"); do
  # ob-launch: kill the agent of host 1 and every process of that host.
  run_ob "r$r" "$steps"
  host="${tag}r${r}n1"
  ob_ms="-" ob_from="-"
  if tool wait ob "ob-r$r.metrics" "$kill_step" "$ob_pid" 120; then
    pids=$( (pgrep -f -- "--agent .*--host $host( |\$)" || true; with_env "OB_HOST=$host") | sort -un | tr '\n' ' ')
    kill_ms=$(now_ms)
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    echo "ob r$r kill_ms=$kill_ms host=$host pids=$pids" >> kills.log
    [ -n "${pids// /}" ] || warn+=("ob-launch recovery run $r: host $host had no process left to kill")
    rc=0; wait_for "$ob_pid" 180 || rc=$?
    # Only a recovery from our kill counts: the first `recovered` line after it.
    line="" early=0
    while IFS= read -r l; do
      t=$(date -d "${l%% *}" +%s%3N)
      if [ "$t" -lt "$kill_ms" ]; then
        early=1
      elif [ -z "$line" ] && [[ $l == *" recovered "* ]]; then
        line=$l
      fi
    done < <(grep ' recovered \| detect ' "ob-r$r/events.log" 2>/dev/null || true)
    [ "$early" = 0 ] ||
      warn+=("ob-launch recovery run $r: a host loss was detected before the kill (see ob-r$r/events.log)")
    ! grep ' detect lost the agent on host ' "ob-r$r/events.log" 2>/dev/null | grep -qv "host $host " ||
      warn+=("ob-launch recovery run $r: a host we did not kill was lost too (see ob-r$r/events.log)")
    if [ -n "$line" ]; then
      rec_ms=$(( $(date -d "${line%% *}" +%s%3N) - kill_ms ))
      ob_ms=$rec_ms
      from=$(sed -n 's/.* from_step=\([0-9]*\).*/\1/p' <<< "$line")
      [ -z "$from" ] || ob_from=$((from + 1))  # the state after from_step; the next step runs
      ob_recs+=("$ob_ms")
    else
      ob_note="no 'recovered' line after the kill in events.log: ob-launch exited $rc (75: it did not recover in place; a build without in-place recovery always does); see $(basename "$work")/ob-r$r/events.log"
    fi
  else
    ob_note="ob-launch run $r never reached step $kill_step (see ob-r$r.out)"
  fi
  kill_tagged

  # torchrun: kill local rank 1's worker; the agent restarts all four from
  # the last checkpoint.
  run_ddp "r$r" "$steps" --ckpt "$work/ckpt-r$r.pt" --ckpt-every 10
  ddp_ms="-" ddp_from="-" ddp_ready="-"
  if tool wait ddp "ddp-r$r" "$kill_step" "$ddp_pid" 180; then
    victim=$(sed -n 's/^start .*restart=0 pid=\([0-9]*\).*/\1/p' "ddp-r$r/rank1.log" | head -1)
    kill_ms=$(now_ms)
    kill -9 "$victim"
    echo "ddp r$r kill_ms=$kill_ms pid=$victim" >> kills.log
    rc=0; wait_for "$ddp_pid" 300 || rc=$?
    read -r ddp_ms ddp_from ddp_ready < <(tool ddp-recovered "ddp-r$r" "$kill_ms" || true) || true
    if [ "$ddp_ms" != "-" ]; then
      ddp_recs+=("$ddp_ms")
    else
      warn+=("torchrun recovery run $r: no step after the kill (exit $rc; see ddp-r$r.out)")
    fi
  else
    warn+=("torchrun recovery run $r never reached step $kill_step (see ddp-r$r.out)")
  fi
  kill_tagged
  # shellcheck disable=SC2059
  printf "$rfmt" "$r" "$ob_ms" "$ob_from" "$ddp_ms" "$ddp_ready" "$ddp_from"
done
ob_rec=$(tool median "${ob_recs[@]}")
ddp_rec=$(tool median "${ddp_recs[@]}")
# shellcheck disable=SC2059
printf "$rfmt" "median" "$ob_rec" "" "$ddp_rec" "" ""
echo "#"
echo "# summary"
echo "#   tokens/s (steady state, medians): ob-launch ${med[ob_wall]} (p50 ${med[ob_p50]}), torch DDP ${med[ddp_wall]} (p50 ${med[ddp_p50]});"
echo "#     ob / DDP = $(tool ratio "${med[ob_wall]}" "${med[ddp_wall]}") (p50 $(tool ratio "${med[ob_p50]}" "${med[ddp_p50]}")); target >= 1.0"
echo "#   recovery (median): ob-launch ${ob_rec} ms, torchrun ${ddp_rec} ms; torchrun / ob = $(tool ratio "$ddp_rec" "$ob_rec") (target >= 10)"
[ -z "$ob_note" ] || warn+=("ob-launch recovery not measured in every run: $ob_note")
for w in "${warn[@]}"; do echo "# WARNING: $w"; done
[ "${#warn[@]}" = 0 ] || keep=1
