# A Slurm cluster on this machine for tests/process/*.sh: slurmctld in the
# root namespace on a bridge, one slurmd per node in a network namespace of
# its own (node NAME at 10.R.0.(i+1), the bridge at 10.R.0.1), no munge
# (auth/none: nothing here is reachable from outside the machine), no
# cgroups, no accounting. Inside a node's namespace its name and the
# machine's hostname resolve to its own address (/etc/netns/NS/hosts).
#
# Source after defining skip() and fail(); call slurm_up DIR NODE... after
# putting slurm_down in the EXIT trap, before anything that removes DIR: it kills the daemons and every step
# they started, and removes the namespaces, the bridge and /etc/netns
# entries, on every path. Every command is bounded.

SLURM_DIR=""
SLURM_NODES=()
SLURM_R=""

# slurm_require: skips unless root, `ip`, and Slurm's daemons and clients.
slurm_require() {
  [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, slurmd)"
  command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
  local t
  for t in slurmctld slurmd sbatch srun squeue scancel sinfo; do
    command -v "$t" >/dev/null || skip "Slurm is not installed (no $t; apt-get install slurm-wlm)"
  done
}

# slurm_up DIR NODE...: the cluster, its files in DIR; exports SLURM_CONF.
# Waits (bounded) until every node is idle. $SLURM_CONF_EXTRA (lines) is
# appended to slurm.conf (e.g. SlurmdTimeout=10).
slurm_up() {
  SLURM_DIR=$1
  shift
  SLURM_NODES=("$@")
  SLURM_R=$(( 100 + $$ % 100 ))
  local host i n ns
  host=$(hostname -s)
  mkdir -p "$SLURM_DIR/state"
  ip link add "obsb$$" type bridge || fail "bridge"
  ip addr add "10.$SLURM_R.0.1/24" dev "obsb$$" && ip link set "obsb$$" up || fail "bridge address"
  for i in "${!SLURM_NODES[@]}"; do
    n=${SLURM_NODES[$i]}
    ns="obs$$-$n"
    ip netns add "$ns" || fail "ip netns add $ns"
    ip -n "$ns" link set lo up
    ip link add "obsv$$-$i" type veth peer name eth0 netns "$ns" || fail "veth $ns"
    ip link set "obsv$$-$i" master "obsb$$" up
    ip -n "$ns" addr add "10.$SLURM_R.0.$((i + 2))/24" dev eth0 && ip -n "$ns" link set eth0 up || fail "address in $ns"
    ip -n "$ns" route add default via "10.$SLURM_R.0.1"
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      echo "10.$SLURM_R.0.$((i + 2)) $host"
      for j in "${!SLURM_NODES[@]}"; do echo "10.$SLURM_R.0.$((j + 2)) ${SLURM_NODES[$j]}"; done
    } > "/etc/netns/$ns/hosts"
  done
  {
    echo "ClusterName=obtest"
    echo "SlurmctldHost=$host(10.$SLURM_R.0.1)"
    echo "SlurmctldPort=$(( 17000 + SLURM_R * 2 ))"
    echo "SlurmdPort=$(( 17001 + SLURM_R * 2 ))"
    echo "AuthType=auth/none"
    echo "CredType=cred/none"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$SLURM_DIR/state"
    echo "SlurmdSpoolDir=$SLURM_DIR/spool-%n"
    echo "SlurmctldPidFile=$SLURM_DIR/slurmctld.pid"
    echo "SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid"
    echo "SlurmctldLogFile=$SLURM_DIR/slurmctld.log"
    echo "SlurmdLogFile=$SLURM_DIR/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SchedulerType=sched/builtin"
    echo "KillWait=5"
    for i in "${!SLURM_NODES[@]}"; do
      echo "NodeName=${SLURM_NODES[$i]} NodeAddr=10.$SLURM_R.0.$((i + 2)) CPUs=$(nproc) State=UNKNOWN"
    done
    [ -n "${SLURM_CONF_EXTRA:-}" ] && echo "$SLURM_CONF_EXTRA"
    echo "PartitionName=obtest Nodes=$(IFS=,; echo "${SLURM_NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
  } > "$SLURM_DIR/slurm.conf"
  printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n' > "$SLURM_DIR/cgroup.conf"
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  timeout 10 slurmctld -f "$SLURM_CONF" -i 2> "$SLURM_DIR/slurmctld.err" || fail "slurmctld: $(tail -3 "$SLURM_DIR/slurmctld.err")"
  for n in "${SLURM_NODES[@]}"; do
    timeout 10 ip netns exec "obs$$-$n" slurmd -f "$SLURM_CONF" -N "$n" 2> "$SLURM_DIR/slurmd-$n.err" \
      || fail "slurmd $n: $(tail -3 "$SLURM_DIR/slurmd-$n.err")"
  done
  _slurm_idle() { [ "$(timeout 5 sinfo -h -t idle -o %D 2>/dev/null)" = "${#SLURM_NODES[@]}" ]; }
  wait_for 30 _slurm_idle || fail "Slurm nodes not idle in 30 s: $(timeout 5 sinfo 2>&1 | tr '\n' '|') $(tail -3 "$SLURM_DIR"/slurmd-*.log | tr '\n' '|')"
}

# slurm_power_off NODE: NODE as when its machine loses power: its link goes
# down, then every process in its namespace (its slurmd, the steps that
# slurmd started and all they started) is SIGKILLed; nothing leaves it.
slurm_power_off() {
  local ns="obs$$-$1" pid
  ip -n "$ns" link set eth0 down || fail "link down in $ns"
  _slurm_ns_empty() {
    local p=$(ip netns pids "$ns" 2>/dev/null)
    [ -z "$p" ] && return 0
    for pid in $p; do kill -9 "$pid" 2>/dev/null; done
    return 1
  }
  wait_for 10 _slurm_ns_empty || fail "processes left in $ns: $(ip netns pids "$ns" | xargs -r ps -o pid,args -p)"
}

# slurm_down: every daemon and step of ours killed, namespaces and links gone.
slurm_down() {
  local pid f n
  [ -n "$SLURM_DIR" ] || return 0
  for f in "$SLURM_DIR"/slurmctld.pid "$SLURM_DIR"/slurmd-*.pid; do
    [ -f "$f" ] && pid=$(cat "$f") && kill -9 "$pid" 2>/dev/null
  done
  # Whatever was started with our configuration (slurmctld's own helper
  # slurmscriptd is its child, and dies with it).
  pkill -9 -f -- "-f $SLURM_DIR/slurm.conf" 2>/dev/null
  for n in "${SLURM_NODES[@]}"; do
    for pid in $(ip netns pids "obs$$-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "obs$$-$n" 2>/dev/null
    rm -rf "/etc/netns/obs$$-$n"
  done
  for f in /sys/class/net/obsv$$-*; do [ -e "$f" ] && ip link del "$(basename "$f")" 2>/dev/null; done
  ip link del "obsb$$" 2>/dev/null
  SLURM_NODES=()
  return 0
}

# slurm_job_setup STEPS (after sourcing launch.sh): the secret; NODES, the
# three nodes ${TAG}a, b, c, in $WORK/hosts.txt; gpt-tiny (fp32, sequence
# 32) planned for them with f = 1 ($WORK/plan.pb); the uninterrupted
# reference, one worker on the same samples for STEPS steps ($WORK/ref.pb).
slurm_job_setup() {
  (umask 077; echo "secret-$TAG-for-the-tests" > "$WORK/secret")
  "$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q \
    -o "$WORK/tiny.pb" || fail "ob-profile"
  NODES=("${TAG}a" "${TAG}b" "${TAG}c")
  printf '%s\n' "${NODES[@]}" > "$WORK/hosts.txt"
  "$OB_BIN/ob-plan" --hosts "$WORK/hosts.txt" -g 1 -f 1 -B 8 --gpu-memory 1 --overhead-gib 0 \
    -o "$WORK/plan.pb" "$WORK/tiny.pb" || fail "ob-plan"
  echo "${TAG}h0" > "$WORK/one.hosts"
  "$OB_BIN/ob-plan" --hosts "$WORK/one.hosts" -g 1 -f 0 -B 8 --gpu-memory 1 --overhead-gib 0 \
    -o "$WORK/one.plan" "$WORK/tiny.pb" || fail "ob-plan for one worker"
  RUN_PLAN="$WORK/one.plan" RUN_HOSTS="$WORK/one.hosts" reference_run "$1"
}

# slurm_submit HEAD FLAGS...: a batch job on the three nodes ($WORK/job.sh,
# output $WORK/job.out) whose script has the lines HEAD (#SBATCH options,
# exports; may be empty), then runs ob-launch --rsh slurm on $WORK/plan.pb
# with FLAGS (run directory $WORK/run, metrics $WORK/slurm.pb, the fixed
# corpus); sets JOB; job_running is true while Slurm lists it.
slurm_submit() {
  local head=$1
  shift
  {
    echo '#!/bin/bash'
    [ -n "$head" ] && echo "$head"
    printf 'exec %q --rsh slurm --secret-file %q --run-dir %q --data %q --metrics %q' "$OB_BIN/ob-launch" \
      "$WORK/secret" "$WORK/run" "$OB_SOURCE_DIR/tests/data/corpus.txt" "$WORK/slurm.pb"
    printf ' %q' "$@" "$WORK/plan.pb"
    echo
  } > "$WORK/job.sh"
  JOB=$(timeout 10 sbatch --parsable -N3 -J "ob-$TAG" -o "$WORK/job.out" "$WORK/job.sh") || fail "sbatch"
}
job_running() { timeout 5 squeue -h -j "$JOB" | grep -q .; }
