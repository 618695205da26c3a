#!/usr/bin/env bash
# Devices, precision and threads on the launch side (ob-launch(1) --device,
# --precision), on 4 local hosts of one worker each (stand-in workers):
#  1. a plan profiled in float32 run with --precision bf16 is refused before
#     any host starts: exit 78, one line naming the plan file and both;
#  2. --device cuda on hosts with no GPU ($OB_GPUS_PER_HOST=0): every agent
#     refuses its workers with one line naming its host, the run exits 78
#     and leaves nothing behind;
#  3. --device cuda with one GPU per host: each worker gets
#     CUDA_VISIBLE_DEVICES=0 (its slot) and OB_DEVICE=cuda; its thread
#     variables are max(1, cores / workers) unless the agent's environment
#     sets them (MKL_NUM_THREADS=3 here is passed through as it is), and
#     so are the standbys'. (A BLAS pool following OMP_NUM_THREADS:
#     devices_test.)
#  4. in a cgroup whose CPU quota is one CPU, the agents share that one
#     CPU, not the two of the affinity mask, and say so;
#  5. hosts that are one machine, through an --rsh that is not `local`
#     (each agent's GPUs as $OB_TEST_GPU_IDS): two whose workers would use
#     one GPU are refused before any worker starts, exit 78, one line
#     naming both hosts and the GPU (the run started, its workers sharing
#     GPUs, before 2026-11-28); with GPUs of their own each, the run goes
#     on and says, in a warning and events.log, that they are one machine;
#  6. --device auto where one host sees no GPU: refused before any worker
#     starts, exit 78, one line naming the hosts on each device;
#  7. one host whose ob-launch is another build ($OB_TEST_BUILD through the
#     rsh: a node left with an older install): refused before any worker
#     starts, exit 78, one line naming it and both builds (before
#     2026-11-28 it trained beside the others).
#  8. a host whose GPU has less memory than the plan's stages need (each
#     agent's GPU memory as $OB_TEST_GPU_MEMORY: h2's 4 MiB, the others'
#     an H100's): refused before any worker starts, exit 78, one line
#     naming that host alone, both sizes and what to give ob-plan (before
#     2026-11-29 every generation ran out of memory at its first step,
#     until 3 recoveries in a row had completed no step).
NAME=launch_devices
source "$(dirname "$0")/../lib/launch.sh"
make_pipelines 4 1

# 1. Precision against the plan's profile.
"$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/p" --precision bf16 \
  "$WORK/plan.pb" "$WORK/hosts.txt" > /dev/null 2> "$WORK/p.err"
rc=$?
[ "$rc" = 78 ] || fail "--precision bf16 on a float32 plan: exit $rc, expected 78: $(cat "$WORK/p.err")"
[ "$(grep -c . "$WORK/p.err")" = 1 ] || fail "not one line: $(cat "$WORK/p.err")"
grep -q "plan.pb: the plan was made for fp32 .* the run asks for bf16" "$WORK/p.err" \
  || fail "the refusal does not name the plan and both precisions: $(cat "$WORK/p.err")"
no_tagged || fail "a refused run left processes: $(tagged)"
echo "$NAME: $(cat "$WORK/p.err")"

# 2. More workers than GPUs.
OB_GPUS_PER_HOST=0 OB_TEST_WORKER_CMD="exec sleep 60" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --secret-file "$WORK/secret" --run-dir "$WORK/g" --device cuda --precision fp32 \
  "$WORK/plan.pb" "$WORK/hosts.txt" > /dev/null 2> "$WORK/g.err"
rc=$?
[ "$rc" = 78 ] || fail "--device cuda without GPUs: exit $rc, expected 78: $(tail -3 "$WORK/g.err")"
line=$(tail -1 "$WORK/g.err")
[[ "$line" =~ ^ob-launch:\ host\ ${TAG}h[1-4]\ refused\ generation\ 1:\ host\ ${TAG}h[1-4]\ has\ 0\ GPU\(s\)\ and\ the\ plan\ puts\ 1\ worker\(s\)\ on\ it ]] \
  || fail "last line: $line"
grep -q " refused host ${TAG}h" "$WORK/g/events.log" || fail "no refused line in events.log"
wait_for 3 no_tagged || fail "processes left after the refusal: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: $line"

# 3. One GPU per worker, threads per worker.
export OB_GPUS_PER_HOST=1 MKL_NUM_THREADS=3
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS
stand_in_start c --device cuda --precision fp32
unset OB_GPUS_PER_HOST MKL_NUM_THREADS
# The cores the agents see: this machine's, or fewer where this test runs
# under a CPU quota (scripts/cpu-limit: its whole CPUs, rounded up, as the
# agents count them, devices.h).
cores=$(nproc) quota_said=""
v1=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3; exit}' /proc/self/cgroup)
if [ -n "$v1" ] && [ -f "/sys/fs/cgroup/cpu$v1/cpu.cfs_quota_us" ]; then
  q=$(cat "/sys/fs/cgroup/cpu$v1/cpu.cfs_quota_us") per=$(cat "/sys/fs/cgroup/cpu$v1/cpu.cfs_period_us")
elif [ -f "/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3; exit}' /proc/self/cgroup)/cpu.max" ]; then
  read -r q per < "/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3; exit}' /proc/self/cgroup)/cpu.max"
else
  q=max per=1
fi
if [[ "$q" =~ ^[0-9]+$ ]] && [ "$(( (q + per - 1) / per ))" -lt "$cores" ]; then
  cores=$(( (q + per - 1) / per )); [ "$cores" -ge 1 ] || cores=1
  quota_said=" (the CPU quota of its cgroup)"
fi
want=$(( cores / 4 )); [ "$want" -ge 1 ] || want=1  # --rsh local: 4 workers share this machine
for p in $(grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ | xargs -r grep -lsa "OB_RANK=" | cut -d/ -f3); do
  env=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null) || continue
  grep -qx "CUDA_VISIBLE_DEVICES=0" <<< "$env" || fail "worker $p: $(grep CUDA_VISIBLE <<< "$env")"
  grep -qx "OB_DEVICE=cuda" <<< "$env" || fail "worker $p: no OB_DEVICE=cuda"
  grep -qx "MKL_NUM_THREADS=3" <<< "$env" || fail "worker $p: $(grep MKL_NUM <<< "$env")"
  grep -qx "OMP_NUM_THREADS=$want" <<< "$env" || fail "worker $p: $(grep OMP_NUM <<< "$env"), want $want"
done
# Standbys start with the threads they will get (their pools are sized at
# start: a standby sized for the whole machine took 1.5 s instead of 0.4
# for its first step after a recovery).
standbys=0
for p in $(grep -lsa "OB_HOST=$TAG" /proc/[0-9]*/environ | xargs -r grep -Lsa "OB_RANK=" | cut -d/ -f3); do
  grep -qa -- "--standby-worker" "/proc/$p/cmdline" 2>/dev/null || continue
  env=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null) || continue
  grep -qx "OMP_NUM_THREADS=$want" <<< "$env" || fail "standby $p: $(grep OMP_NUM <<< "$env"), want $want"
  grep -qx "OPENBLAS_NUM_THREADS=$want" <<< "$env" || fail "standby $p: $(grep OPENBLAS_NUM <<< "$env"), want $want"
  standbys=$((standbys + 1))
done
[ "$standbys" -gt 0 ] || fail "no standby worker to check"
grep -q "1 worker(s) here, 4 sharing $cores core(s)$quota_said, cuda: OMP_NUM_THREADS=$want, OPENBLAS_NUM_THREADS=$want, MKL_NUM_THREADS=3 (from the environment)" \
  "$WORK/c.err" || fail "no agent line on threads: $(grep -m1 'worker(s) on' "$WORK/c.err")"
stop_master c
echo "$NAME: $(grep -m1 -o '1 worker(s) here.*' "$WORK/c.err")"

# 4. A CPU quota below the affinity mask (a container's --cpus): the agents
# share the quota's CPUs, not the mask's, and say so. In a cgroup of our own
# with a quota of one CPU (v1's cpu controller, or v2's where the root
# delegates it), this shell moved in for the run and out again after.
CG=""
cg_cleanup() {
  [ -n "$CG" ] || return 0
  echo $$ > "$CG_PARENT/cgroup.procs" 2>/dev/null
  local i
  for ((i = 0; i < 50; i++)); do rmdir "$CG" 2>/dev/null && break; sleep 0.1; done
  CG=""
}
trap 'cleanup; cg_cleanup' EXIT
if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && [ -w /sys/fs/cgroup/cpu ]; then
  CG_PARENT=/sys/fs/cgroup/cpu CG=/sys/fs/cgroup/cpu/ob-$TAG
  mkdir "$CG" && echo 100000 > "$CG/cpu.cfs_period_us" && echo 100000 > "$CG/cpu.cfs_quota_us" \
    || fail "cannot make a cgroup with a CPU quota at $CG"
elif [ -f /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control \
    && [ "$(cat /proc/self/cgroup)" = "0::/" ]; then
  CG_PARENT=/sys/fs/cgroup CG=/sys/fs/cgroup/ob-$TAG
  mkdir "$CG" && echo "100000 100000" > "$CG/cpu.max" || fail "cannot make a cgroup with a CPU quota at $CG"
fi
if [ -n "$CG" ]; then
  echo $$ > "$CG/cgroup.procs" || fail "cannot move into $CG"
  # Not stand_in_start: its wait for all four stand-ins up at once is not
  # what this part checks, and on one throttled CPU a stand-in (which never
  # beats) handed to a standby can be killed at its role deadline before the
  # last one starts. The agents' line is written as they start their workers.
  STAND_IN_TIMEOUT=60 stand_in_launch q
  echo $$ > "$CG_PARENT/cgroup.procs"
  said() { [ "$(grep -c '1 worker(s) here' "$WORK/q.err")" -ge 4 ]; }
  wait_for 30 said || fail "q: the agents did not start their workers: $(tail -3 "$WORK/q.err")"
  line=$(grep -m1 -o '1 worker(s) here.*' "$WORK/q.err")
  [[ "$line" == "1 worker(s) here, 4 sharing 1 core(s) (the CPU quota of its cgroup), cpu: "* ]] \
    || fail "quota of 1 CPU: $line"
  stop_master q
  cg_cleanup
  echo "$NAME: $line"
else
  echo "$NAME: no cgroup CPU controller to set a quota in here: part 4 not run"
fi

# 5. Hosts that are one machine. The rsh runs the agent here, with the
# GPUs its host is given.
cat > "$WORK/rsh" <<'SH'
#!/usr/bin/env bash
host=$1; shift
n=${host##*h}
OB_TEST_GPU_IDS=$(printf "$GPU_IDS" "$n") exec "$@"
SH
chmod +x "$WORK/rsh"
machine_run() {  # NAME: stand-in workers on 4 hosts through $WORK/rsh, --device cuda
  OB_GPUS_PER_HOST=1 STAND_IN_RSH="$WORK/rsh" stand_in_launch "$1" --bind 127.0.0.1 --device cuda --precision fp32
}
export GPU_IDS="GPU-0000000%s"
GPU_IDS="GPU-shared" machine_run same
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 78 ] || fail "two hosts on one GPU: exit $rc, expected 78: $(tail -3 "$WORK/same.err")"
line=$(tail -1 "$WORK/same.err")
[[ "$line" =~ ^ob-launch:\ hosts\ ${TAG}h[1-4]\ and\ ${TAG}h[1-4]\ would\ both\ run\ workers\ on\ GPU\ GPU-shared:\ list\ each\ machine\ once ]] \
  || fail "two hosts on one GPU: last line: $line"
! grep -q start-workers "$WORK/same/events.log" || fail "two hosts on one GPU: workers were started"
wait_for 3 no_tagged || fail "processes left after the refusal: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: $line"
machine_run own
own_up() { grep -q start-workers "$WORK/own/events.log" 2> /dev/null && [ "$(count_workers)" -ge 4 ]; }
wait_for 10 own_up || fail "GPUs of their own: workers did not start: $(tail -3 "$WORK/own.err")"
grep -q "warning: hosts ${TAG}h1 and ${TAG}h2 run on one machine (kernel boot id $(cat /proc/sys/kernel/random/boot_id)): a failure of it takes both" \
  "$WORK/own.err" || fail "GPUs of their own: no warning of one machine: $(grep -m2 warn "$WORK/own.err")"
[ "$(grep -c ' one-machine ' "$WORK/own/events.log")" = 6 ] || fail "not 6 pairs in events.log: $(grep one-machine "$WORK/own/events.log")"
stop_master own

# 6. --device auto on hosts of which one sees no GPU (a driver fault): the
# job is refused before any worker starts, naming the host, where it ran
# CUDA workers beside a CPU one (before 2026-11-28).
cat > "$WORK/rsh-nogpu" <<'SH'
#!/usr/bin/env bash
host=$1; shift
case $host in *h4) export OB_GPUS_PER_HOST=0 ;; *) export OB_GPUS_PER_HOST=1 ;; esac
exec "$@"
SH
chmod +x "$WORK/rsh-nogpu"
STAND_IN_RSH="$WORK/rsh-nogpu" stand_in_launch mixed --bind 127.0.0.1 --device auto --precision fp32
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 78 ] || fail "hosts with and without GPUs: exit $rc, expected 78: $(tail -3 "$WORK/mixed.err")"
line=$(tail -1 "$WORK/mixed.err")
[[ "$line" == "ob-launch: hosts run on different devices: cuda on ${TAG}h1, ${TAG}h2, ${TAG}h3; cpu on ${TAG}h4 (no GPU seen there: --device auto)."* ]] \
  || fail "hosts with and without GPUs: last line: $line"
! grep -q start-workers "$WORK/mixed/events.log" || fail "hosts with and without GPUs: workers were started"
wait_for 3 no_tagged || fail "processes left after the refusal: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: $line"

# 7. Another build on one host.
cat > "$WORK/rsh-build" <<'SH'
#!/usr/bin/env bash
host=$1; shift
case $host in *h3) export OB_TEST_BUILD="ob-launch 0.0.9 (old), LibTorch 1.13.0" ;; esac
exec "$@"
SH
chmod +x "$WORK/rsh-build"
STAND_IN_RSH="$WORK/rsh-build" stand_in_launch build --bind 127.0.0.1 --device cpu
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 78 ] || fail "another build on one host: exit $rc, expected 78: $(tail -3 "$WORK/build.err")"
line=$(tail -1 "$WORK/build.err")
[[ "$line" =~ ^ob-launch:\ hosts\ run\ another\ build\ of\ ob-launch\ than\ this\ master\ \(ob-launch\ [^\)]+\),\ LibTorch\ [0-9.a-z+]+\):\ ob-launch\ 0\.0\.9\ \(old\),\ LibTorch\ 1\.13\.0\ on\ ${TAG}h3\.\ Install\ this\ one\ on\ every\ host ]] \
  || fail "another build on one host: last line: $line"
! grep -q start-workers "$WORK/build/events.log" || fail "another build on one host: workers were started"
wait_for 3 no_tagged || fail "processes left after the refusal: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: $line"

# 8. GPUs smaller than the plan's stages on one host.
cat > "$WORK/rsh-mem" <<'SH'
#!/usr/bin/env bash
host=$1; shift
case $host in *h2) export OB_TEST_GPU_MEMORY=4194304 ;; *) export OB_TEST_GPU_MEMORY=85520809984 ;; esac
exec "$@"
SH
chmod +x "$WORK/rsh-mem"
OB_GPUS_PER_HOST=1 STAND_IN_RSH="$WORK/rsh-mem" stand_in_launch mem --bind 127.0.0.1 --device cuda --precision fp32
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 78 ] || fail "a GPU too small for the plan: exit $rc, expected 78: $(tail -3 "$WORK/mem.err")"
line=$(tail -1 "$WORK/mem.err")
want="^ob-launch: the plan's stages need up to [0-9.]+ MiB of GPU memory \(it was made for GPUs of 12\.3 MiB\), more"
want+=" than host ${TAG}h2's GPU 0 has 4\.0 MiB: make the plan for these GPUs \(ob-plan --gpu-memory 0\.003, or a"
want+=" profile measured on one\)\.?$"
[[ "$line" =~ $want ]] \
  || fail "a GPU too small for the plan: last line: $line"
! grep -q start-workers "$WORK/mem/events.log" || fail "a GPU too small for the plan: workers were started"
wait_for 3 no_tagged || fail "processes left after the refusal: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: $line"
echo "$NAME: ok"
