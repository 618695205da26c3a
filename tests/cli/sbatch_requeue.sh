# contrib/ob-train.sbatch's control flow, with ob-plan, ob-launch and
# scontrol stood in for by scripts that log what they were asked: Slurm's
# SIGUSR1 before the time limit is passed on to ob-launch, and the job is
# requeued once ob-launch has saved and exited 0, so a long run goes on in
# the next allocation (before, it ended there as COMPLETED, the training
# unfinished); exit 75 (failures beyond the plan) requeues too; a run that
# finishes, or that scancel's SIGTERM stops, is not requeued; and the
# script exits with ob-launch's own status, not the 128 + N of a `wait` a
# trapped signal cut short.
source "$(dirname "$0")/../lib/assert.sh"
SCRIPT="$OB_SOURCE_DIR/contrib/ob-train.sbatch"
mkdir -p "$TMP/bin" "$TMP/job"
cat > "$TMP/bin/ob-plan" <<'EOF'
#!/bin/bash
echo "ob-plan $*" >> "$LOG"
EOF
# Runs until a signal (USR1 or TERM: logged, then it exits STOP_RC after a
# moment, as the master does once its checkpoint is committed), or exits
# RC at once when RC is set.
cat > "$TMP/bin/ob-launch" <<'EOF'
#!/bin/bash
echo "ob-launch $*" >> "$LOG"
[ -n "${RC:-}" ] && exit "$RC"
trap 'echo "got USR1" >> "$LOG"; sleep 0.2; exit "${STOP_RC:-0}"' USR1
trap 'echo "got TERM" >> "$LOG"; sleep 0.2; exit "${STOP_RC:-0}"' TERM
echo started > "$TMP_DIR/started"
for _ in $(seq 200); do sleep 0.05; done
exit 99
EOF
cat > "$TMP/bin/scontrol" <<'EOF'
#!/bin/bash
echo "scontrol $*" >> "$LOG"
EOF
chmod +x "$TMP/bin/"*

# run NAME SIGNAL [VAR=VALUE...]: the script as a batch job 4242, SIGNAL
# sent to it (the batch shell, as --signal=B: does) once ob-launch runs
# ('' for none); its exit status in $TMP/NAME.rc, the log in $TMP/NAME.log.
run() {
  local name=$1 sig=$2; shift 2
  rm -f "$TMP/started"
  env "$@" LOG="$TMP/$name.log" TMP_DIR="$TMP" OB="$TMP/bin" SHARED="$TMP" JOB_DIR="$TMP/job" \
    SLURM_JOB_ID=4242 PATH="$TMP/bin:$PATH" bash "$SCRIPT" > "$TMP/$name.out" 2>&1 &
  local pid=$!
  if [ -n "$sig" ]; then
    for _ in $(seq 100); do [ -f "$TMP/started" ] && break; sleep 0.05; done
    [ -f "$TMP/started" ] || fail "$name: ob-launch did not start: $(cat "$TMP/$name.out")"
    kill -"$sig" "$pid"
  fi
  wait "$pid"
  echo $? > "$TMP/$name.rc"
}
requeued() { grep -qx "scontrol requeue 4242" "$TMP/$1.log"; }
check() {  # check NAME RC REQUEUED(yes|no)
  local got
  got=$(cat "$TMP/$1.rc")
  [ "$got" = "$2" ] && pass || fail "$1: exit $got, expected $2: $(cat "$TMP/$1.out" "$TMP/$1.log")"
  if [ "$3" = yes ]; then requeued "$1" && pass || fail "$1: not requeued: $(cat "$TMP/$1.log")"
  else ! requeued "$1" && pass || fail "$1: requeued: $(cat "$TMP/$1.log")"; fi
}

run limit USR1
check limit 0 yes
grep -q "^got USR1" "$TMP/limit.log" && pass || fail "limit: USR1 not passed on: $(cat "$TMP/limit.log")"
grep -q -- "--resume auto" "$TMP/limit.log" && grep -q -- "--rsh slurm" "$TMP/limit.log" \
  && grep -q -- "--config $TMP/job/ob-train.yaml " "$TMP/limit.log" && pass \
  || fail "limit: ob-launch's arguments: $(grep ob-launch "$TMP/limit.log")"

run unsaved USR1 STOP_RC=75        # the stop could not save everything
check unsaved 75 yes
run cancelled TERM
check cancelled 0 no
grep -q "^got TERM" "$TMP/cancelled.log" && pass || fail "cancelled: TERM not passed on: $(cat "$TMP/cancelled.log")"
run finished "" RC=0
check finished 0 no
run beyond "" RC=75
check beyond 75 yes
run config "" RC=78
check config 78 no
finish
