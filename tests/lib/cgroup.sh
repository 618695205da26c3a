# CPU throttling of chosen processes for the process tests: a CPU cgroup
# (v1's cpu controller with cpu.cfs_quota_us/cpu.cfs_period_us where it is
# mounted, else v2's cpu.max where the root delegates the cpu controller),
# or, where neither can be made, a SIGSTOP/SIGCONT duty cycle of the same
# share. Source after tests/lib/launch.sh; every cgroup made is removed by
# cg_cleanup, which the caller's EXIT trap must run.
CG_DIRS=() CG_DUTY_PIDS=()
# cg_kind: "v1", "v2" or "duty" (what cg_throttle will use here).
cg_kind() {
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && [ -w /sys/fs/cgroup/cpu ]; then
    echo v1
  elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers \
      && [ -w /sys/fs/cgroup ]; then
    echo v2
  else
    echo duty
  fi
}
# _cg_duty STOP_S RUN_S PID...: stops the processes for STOP_S, lets them
# run for RUN_S, over and over, until SIGTERM (then they run).
_cg_duty() {
  local stop_s=$1 run_s=$2
  shift 2
  trap 'kill -CONT "$@" 2>/dev/null; exit 0' TERM
  while :; do
    kill -STOP "$@" 2>/dev/null || exit 0
    sleep "$stop_s"
    kill -CONT "$@" 2>/dev/null
    sleep "$run_s"
  done
}
# cg_root: the cgroup this test runs in (cpu controller), under which the
# throttles are made and to which their processes go back: a suite run
# inside scripts/cpu-limit stays inside its limit.
cg_root() {
  case "$(cg_kind)" in
    v1) echo "/sys/fs/cgroup/cpu$(awk -F: '$2 == "cpu" || $2 ~ /(^|,)cpu(,|$)/ {print $3; exit}' /proc/$$/cgroup)" ;;
    v2)
      local own
      own="/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3; exit}' /proc/$$/cgroup)"
      if grep -qw cpu "$own/cgroup.subtree_control" 2>/dev/null; then echo "${own%/}"; else echo /sys/fs/cgroup; fi
      ;;
  esac
}
# cg_throttle NAME QUOTA_US PERIOD_US PID...: the processes (every thread)
# get QUOTA_US of CPU time every PERIOD_US between them; CG_KIND says how.
# (Not in a command substitution: its subshell would forget the cgroup, and
# cg_release and cg_cleanup with it.)
cg_throttle() {
  local name=$1 quota=$2 period=$3 kind dir p
  shift 3
  kind=$(cg_kind)
  case "$kind" in
    v1)
      dir=$(cg_root)/ob-$TAG-$name
      mkdir "$dir" && echo "$period" > "$dir/cpu.cfs_period_us" && echo "$quota" > "$dir/cpu.cfs_quota_us" \
        || fail "cannot make a v1 CPU cgroup at $dir"
      ;;
    v2)
      grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
      dir=$(cg_root)/ob-$TAG-$name
      mkdir "$dir" && echo "$quota $period" > "$dir/cpu.max" || fail "cannot make a v2 CPU cgroup at $dir"
      ;;
    duty)
      # Stopped for PERIOD - QUOTA of every PERIOD.
      local run_s stop_s
      run_s=$(awk -v q="$quota" 'BEGIN { printf "%.3f", q / 1e6 }')
      stop_s=$(awk -v q="$quota" -v p="$period" 'BEGIN { printf "%.3f", (p - q) / 1e6 }')
      _cg_duty "$stop_s" "$run_s" "$@" &
      CG_DUTY_PIDS+=("$!:$name")
      CG_KIND=duty
      return 0
      ;;
  esac
  CG_DIRS+=("$dir")
  for p in "$@"; do echo "$p" > "$dir/cgroup.procs" 2> /dev/null || true; done
  CG_KIND=$kind
}
# cg_release NAME: the processes throttled as NAME run freely again (moved
# back to the root cgroup, or their duty cycle ended).
cg_release() {
  local name=$1 d p e
  for e in "${CG_DUTY_PIDS[@]}"; do
    [ "${e#*:}" = "$name" ] && kill -TERM "${e%%:*}" 2>/dev/null && wait "${e%%:*}" 2>/dev/null
  done
  for d in "${CG_DIRS[@]}"; do
    [ "${d##*/}" = "ob-$TAG-$name" ] || continue
    while read -r p; do echo "$p" > "$(cg_root)/cgroup.procs" 2>/dev/null || true; done < "$d/cgroup.procs"
    rmdir "$d" 2>/dev/null || true
  done
}
cg_cleanup() {
  local d e p i
  for e in "${CG_DUTY_PIDS[@]}"; do kill -TERM "${e%%:*}" 2>/dev/null; done
  for d in "${CG_DIRS[@]}"; do
    [ -d "$d" ] || continue
    for ((i = 0; i < 50; i++)); do
      while read -r p; do echo "$p" > "$(cg_root)/cgroup.procs" 2>/dev/null || kill -9 "$p" 2>/dev/null; done < "$d/cgroup.procs"
      rmdir "$d" 2>/dev/null && break
      sleep 0.1
    done
  done
  CG_DIRS=() CG_DUTY_PIDS=()
}
