#!/usr/bin/env bash
# The whole machine stops for longer than --master-timeout and runs again:
# a paused VM, a live migration, a hypervisor that did not schedule us, a
# `kill -STOP` of a job's process group. Master, agents and workers all
# stop at once (a freezer cgroup: the kernel stops every process of the
# job together, as a VM pause does) for 4 s, past the default
# --master-timeout of 3 s and --agent-timeout of 1 s, while two local hosts
# train gpt-tiny; the master runs again half a second after the others (who
# runs first after a pause is the scheduler's choice). Nobody was silent while the others listened, so nobody
# may be blamed: the run goes on in generation 1 and exits 0 with every
# step's loss an uninterrupted run's, without a recovery, and the master
# says that the job did not run for about 4 s. Needs root and the cgroup v1
# freezer (or cgroup v2); exit 77 (skipped) otherwise. The cgroup is thawed
# and removed on every path.
NAME=launch_frozen
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
[ "$(id -u)" = 0 ] || skip "not root"

STEPS=40
FREEZE_AT=12
FREEZE_S=4
LATE_S=0.5

# The freezer: v1 (freezer.state) or v2 (cgroup.freeze).
CG=""
if [ -w /sys/fs/cgroup/freezer ]; then
  CG=/sys/fs/cgroup/freezer/ob-$TAG
  freeze() { echo FROZEN > "$CG/freezer.state"; }
  thaw() { echo THAWED > "$CG/freezer.state"; }
  frozen() { [ "$(cat "$CG/freezer.state")" = FROZEN ]; }
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CG=/sys/fs/cgroup/ob-$TAG
  freeze() { echo 1 > "$CG/cgroup.freeze"; }
  thaw() { echo 0 > "$CG/cgroup.freeze"; }
  frozen() { grep -qx "frozen 1" "$CG/cgroup.events"; }
else
  skip "no cgroup freezer"
fi
mkdir "$CG" 2>/dev/null || skip "cannot make a cgroup under ${CG%/*}"
cg_cleanup() {
  [ -d "$CG" ] || return 0
  thaw 2>/dev/null   # a frozen process cannot even die
  local p
  for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  local i
  for ((i = 0; i < 50; i++)); do rmdir "$CG" 2>/dev/null && return 0; sleep 0.1; done
  echo "$NAME: could not remove $CG" >&2
}
trap 'cg_cleanup; cleanup' EXIT

make_cluster 2
reference_run "$STEPS"

# The master joins the cgroup before it starts anything: every agent and
# worker it starts is in it too.
cat > "$WORK/join" <<EOF
#!/usr/bin/env bash
echo \$\$ > "$CG/cgroup.procs" || exit 70
exec "\$@"
EOF
chmod +x "$WORK/join"
RUN_WRAP="$WORK/join" run_start frozen "$STEPS"
wait_step frozen "$FREEZE_AT" || fail "did not reach step $FREEZE_AT: $(tail -3 "$WORK/frozen.err")"
n=$(grep -c . "$CG/cgroup.procs")
[ "$n" -ge 5 ] || fail "only $n processes in the cgroup (master, 2 agents, 2 workers at least)"
freeze
wait_for 5 frozen || fail "the cgroup did not freeze"
at=$(max_step "$WORK/frozen.pb")
sleep "$FREEZE_S"
# The master runs last: the agents and workers run again $LATE_S s before it
# (on a loaded machine, who runs first after a pause is anybody's guess).
master=$(pgrep -P "$MASTER_PID" -f ob-launch | head -1)
[ -n "$master" ] || fail "no master process under $MASTER_PID"
kill -STOP "$master"
thaw
sleep "$LATE_S"
kill -CONT "$master"
echo "$NAME: froze $n processes for $FREEZE_S s at step $at; the master ran again $LATE_S s after the others"
run_wait

[ "$RC" = 0 ] || fail "exit $RC after a $FREEZE_S s freeze of the whole job: $(tail -3 "$WORK/frozen.err" | tr '\n' '|')"
! grep -q " decide \| start-workers generation=2 " "$WORK/frozen/events.log" \
  || fail "a freeze of everyone cost a recovery: $(grep ' detect \| decide ' "$WORK/frozen/events.log" | tr '\n' '|')"
line=$(grep -o "the master itself did not run for [0-9]* ms" "$WORK/frozen/events.log" | head -1)
[[ "$line" =~ for\ ([0-9]+)\ ms ]] || fail "the master did not say that it stopped: $(grep ' detect ' "$WORK/frozen/events.log" | tr '\n' '|')"
ms=${BASH_REMATCH[1]}
[ "$ms" -ge $(( FREEZE_S * 1000 )) ] && [ "$ms" -le $(( FREEZE_S * 1000 + 2500 )) ] \
  || fail "the master says it did not run for $ms ms; it was frozen for $FREEZE_S s"
python3 "$METRICS_PY" compare "$WORK/ref.pb" "$WORK/frozen.pb" 1e-4 > "$WORK/frozen.cmp" \
  || fail "losses: $(cat "$WORK/frozen.cmp")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: $line; $(cat "$WORK/frozen.cmp")"
echo "$NAME: ok"
