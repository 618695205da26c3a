#!/usr/bin/env bash
# Checkpoints and run directories that never lie (issue 10), 4 local hosts
# in 2 pipelines of 2 stages, f = 1:
#  1. a checkpoint directory and a run directory belong to one run: a
#     second ob-launch on either is refused (78) before it starts a host,
#     and the first one's control socket still answers;
#  2. --resume auto of another job's checkpoints (another seed) is refused
#     (65) unless --resume-from-other; --resume auto of the job's own last
#     step (a requeue of a trained job) exits 0 starting nothing, --resume
#     of a step at or past --steps is refused (64), and with another
#     --eval-split (78);
#     evaluating with one warns that the loss is not a held-out one;
#     data of the same size and ends but another middle is another job's
#     (65);
#  3. a FIFO as --data is refused (65) at once, not waited on;
#  4. a "checkpoint" request too late to be honoured is refused;
#  5. the final checkpoint fails (a full tmpfs): exit 74 naming the latest
#     good checkpoint (root only: mounts a tmpfs);
#  6. beyond f with a damaged newest checkpoint: the master restarts from
#     the newest one that verifies, and says which it skipped and why.
NAME=launch_ckpt_guard
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_two_by_two
launch() {  # RUN [FLAGS...]: ob-launch in the foreground; RC, stderr in $WORK/RUN.err
  local run=$1; shift
  timeout 120 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/$run" \
    --data "${DATA:-$OB_SOURCE_DIR/tests/data/corpus.txt}" "$@" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/$run.err"
  RC=$?
}
one_line() { [ "$(grep -c . "$WORK/$1.err")" = 1 ] || fail "$1: expected one line on stderr: $(cat "$WORK/$1.err")"; }

# 1. Directories of one run.
stand_in_start first --ckpt-dir "$WORK/shared"
launch second --ckpt-dir "$WORK/shared" --steps 5
[ "$RC" = 78 ] || fail "second job on the same --ckpt-dir: exit $RC, expected 78: $(cat "$WORK/second.err")"
grep -q "shared is in use by another process (host .* pid [0-9]*: ob-launch, run directory $WORK/first)" \
  "$WORK/second.err" || fail "the refusal does not name the other run: $(cat "$WORK/second.err")"
one_line second
launch first --steps 5
[ "$RC" = 78 ] || fail "second master in the same run directory: exit $RC, expected 78: $(cat "$WORK/first.err")"
grep -q "first is in use by another process" "$WORK/first.err" || fail "run dir: $(cat "$WORK/first.err")"
control "$WORK/first/control.sock" status | grep -q '"state":"running"' \
  || fail "the first master's control socket no longer answers"
stop_master first

# 2. Another job's checkpoints; a resume with nothing left to train.
launch seed1 --steps 10 --seed 1 --ckpt-dir "$WORK/ck" --ckpt-every 10
[ "$RC" = 0 ] || fail "seed 1 run: exit $RC: $(tail -3 "$WORK/seed1.err")"
# The same command line again (a requeue of a job that trained to its
# end): nothing to do, exit 0, no host started (it exited 64).
launch again --steps 10 --seed 1 --ckpt-dir "$WORK/ck" --resume auto
[ "$RC" = 0 ] || fail "--resume auto of a trained job: exit $RC, expected 0: $(cat "$WORK/again.err")"
grep -q "resume auto: .*step-000000000009 is of step 9, the last of --steps 10: the job is trained; nothing to do" \
  "$WORK/again.err" || fail "a trained job's rerun does not say so: $(cat "$WORK/again.err")"
! grep -qs agent-start "$WORK/again/events.log" || fail "hosts were started for a trained job"
launch seed2 --steps 12 --seed 2 --ckpt-dir "$WORK/ck" --resume auto
[ "$RC" = 65 ] || fail "resume of another job's checkpoint: exit $RC, expected 65: $(cat "$WORK/seed2.err")"
grep -q "step-000000000009: saved by another job (seed 1, this run's is 2)" "$WORK/seed2.err" \
  || fail "the refusal does not say why: $(cat "$WORK/seed2.err")"
one_line seed2
! grep -qs agent-start "$WORK/seed2/events.log" || fail "hosts were started for another job's checkpoint"
launch other --steps 12 --seed 2 --ckpt-dir "$WORK/ck" --resume auto --resume-from-other
[ "$RC" = 0 ] || fail "--resume-from-other: exit $RC: $(tail -3 "$WORK/other.err")"
grep -q " resume generation=1 from .*step-000000000009" "$WORK/other/events.log" || fail "--resume-from-other did not resume"
launch past --steps 10 --seed 1 --ckpt-dir "$WORK/ck" --resume "$WORK/ck/step-000000000009"
[ "$RC" = 64 ] || fail "resume at --steps: exit $RC, expected 64: $(cat "$WORK/past.err")"
grep -q "nothing left to train" "$WORK/past.err" || fail "resume at --steps: $(cat "$WORK/past.err")"
# Another --eval-split trains on other tokens (the held-out ones, or not
# those): another job's checkpoint too (before 2026-11-28 it trained on).
launch split --steps 12 --seed 1 --eval-split 0.1 --resume "$WORK/ck/step-000000000009"
[ "$RC" = 78 ] || fail "resume with another --eval-split: exit $RC, expected 78: $(cat "$WORK/split.err")"
grep -q "step-000000000009: saved by another job (--eval-split 0, this run's is 0.1: it would train on other tokens)" \
  "$WORK/split.err" || fail "the refusal does not say why: $(cat "$WORK/split.err")"
one_line split
# Evaluating it (--steps 0) on a split is allowed, and says that the loss is
# not a held-out one.
launch evalsplit --steps 0 --seed 1 --eval-split 0.1 --resume "$WORK/ck/step-000000000009"
[ "$RC" = 0 ] || fail "evaluating with --eval-split: exit $RC: $(tail -3 "$WORK/evalsplit.err")"
grep -q "was trained with --eval-split 0: of the tokens --eval-split 0.1 evaluates, some were trained on" \
  "$WORK/evalsplit.err" || fail "no warning that the evaluated tokens were trained on: $(tail -3 "$WORK/evalsplit.err")"

# Another file of the same size, the same first and last MiB and the same
# modification time, whose middle differs (a dataset fixed in place): its
# sum over every byte, recorded by the master, tells it from the job's.
# Before 2026-11-29 the fingerprint (size and ends) matched and it resumed.
python3 - "$OB_SOURCE_DIR/tests/data/corpus.txt" "$WORK/big.txt" <<'PY'
import sys
text = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write((text * (3 * 2**20 // len(text) + 1))[:3 * 2**20])
PY
DATA="$WORK/big.txt" launch big --steps 5 --seed 1 --ckpt-dir "$WORK/ck-big"
[ "$RC" = 0 ] || fail "3 MiB data: exit $RC: $(tail -3 "$WORK/big.err")"
python3 - "$WORK/big.txt" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(3 * 2**19); b = f.read(1); f.seek(3 * 2**19); f.write(bytes([b[0] ^ 1]))
PY
touch -d "$(date -r "$WORK/ck-big" +%Y-%m-%dT%H:%M:%S)" "$WORK/big.txt"  # any old time, not the write's
DATA="$WORK/big.txt" launch bigger --steps 8 --seed 1 --ckpt-dir "$WORK/ck-big" --resume auto
[ "$RC" = 65 ] || fail "resume on data changed in its middle: exit $RC, expected 65: $(cat "$WORK/bigger.err")"
grep -q "step-000000000004: saved by another job (data $WORK/big.txt (xxh3=[0-9a-f]\{16\} over every byte), this run reads $WORK/big.txt (xxh3=" \
  "$WORK/bigger.err" || fail "the refusal does not say why: $(cat "$WORK/bigger.err")"
one_line bigger

# 3. A FIFO as data.
mkfifo "$WORK/fifo"
start=$(now_ms)
timeout 20 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/fifo-run" \
  --data "$WORK/fifo" --steps 5 "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/fifo.err"
RC=$?
[ "$RC" = 65 ] || fail "FIFO data: exit $RC, expected 65: $(cat "$WORK/fifo.err")"
grep -q "fifo: not a regular file (a FIFO)" "$WORK/fifo.err" || fail "FIFO data: $(cat "$WORK/fifo.err")"
[ $(( $(now_ms) - start )) -lt 10000 ] || fail "FIFO data took $(( $(now_ms) - start )) ms to refuse"

# 4. A checkpoint request after the last step a save could still happen at.
# Rank 0 made slow (50x its compute) so that step 4 and the final save
# outlast the request: at full speed the run could end between the step-3
# report and the request, whose socket was then gone (an empty answer).
# (The request after step 3 of 5 asks for step 5, past the last; 5 steps
# show it as 30 did, in a sixth of the time.)
run_start late 5 --ckpt-dir "$WORK/ck-late" --inject 0:slow=50
wait_step late 3 || fail "late: no step 3: $(tail -3 "$WORK/late.err")"
answer=$(control "$WORK/late/control.sock" "checkpoint too late")
[[ "$answer" == *'"ok":false'* && "$answer" == *"too late"* ]] || fail "late checkpoint request: $answer"
run_wait
[ "$RC" = 0 ] || fail "late: exit $RC"

# 6. Beyond f, the newest checkpoint damaged.
read -r first_a first_b < <(python3 - "$WORK/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["instantiation"]["pipelines"]
print(p[0]["nodes"][0], p[1]["nodes"][0])
PY
)
# (Every rank parked before step 35 until the kill: the run is still going
# when it comes, whatever this machine's speed.)
export OB_INJECT_RELEASE="$WORK/release"
park() { echo "0:park=$1;1:park=$1;2:park=$1;3:park=$1"; }
run_start damaged 60 --ckpt-dir "$WORK/ck-dmg" --ckpt-every 10 --inject "$(park 35)"
committed() { grep -q " checkpoint step=29 " "$WORK/damaged/events.log" 2>/dev/null; }
wait_for 90 committed || fail "no checkpoint of step 29: $(tail -3 "$WORK/damaged.err")"
python3 - "$WORK/ck-dmg/step-000000000029/layer-0001.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-10, 2); b = f.read(1); f.seek(-10, 2); f.write(bytes([b[0] ^ 0xFF]))
PY
kill -9 $(host_pids "$first_a") $(host_pids "$first_b")
touch "$OB_INJECT_RELEASE"
run_wait
[ "$RC" = 0 ] || fail "beyond f, newest damaged: exit $RC: $(tail -3 "$WORK/damaged.err")"
grep -q "skip-checkpoint .*step-000000000029/layer-0001.safetensors" "$WORK/damaged/events.log" \
  || fail "the damaged checkpoint is not named: $(grep -E 'skip|decide' "$WORK/damaged/events.log")"
grep -q "restarting from checkpoint .*step-000000000019 " "$WORK/damaged/events.log" \
  || fail "no restart from step 19: $(grep decide "$WORK/damaged/events.log")"
[ "$(max_step "$WORK/damaged.pb")" = 59 ] || fail "beyond f, newest damaged: did not reach the last step"
echo "$NAME: beyond f: $(grep -o 'skip-checkpoint .*' "$WORK/damaged/events.log" | cut -c 1-160)"

# 7. The newest checkpoint with a truncated file (issue 54): --resume auto
# passes over it to the one before, with its skip-checkpoint line, as for a
# flipped bit.
run_start cut 20 --ckpt-dir "$WORK/ck-cut" --ckpt-every 10 --standby off
run_wait
[ "$RC" = 0 ] || fail "cut: exit $RC: $(tail -3 "$WORK/cut.err")"
victim="$WORK/ck-cut/step-000000000019/layer-0001.safetensors"
[ -f "$victim" ] || fail "cut: no $victim"
truncate -s $(( $(stat -c %s "$victim") / 2 )) "$victim"
run_start cut2 25 --ckpt-dir "$WORK/ck-cut" --resume auto --standby off
run_wait
[ "$RC" = 0 ] || fail "cut: resume past a truncated checkpoint: exit $RC: $(tail -3 "$WORK/cut2.err")"
grep -q "skip-checkpoint $victim: .*(truncated)" "$WORK/cut2/events.log" \
  || fail "cut: the truncated checkpoint is passed over in silence: $(grep -E 'skip|resume' "$WORK/cut2/events.log")"
grep -q " resume .*step-000000000009" "$WORK/cut2/events.log" \
  || fail "cut: not resumed from step 9: $(grep resume "$WORK/cut2/events.log")"
echo "$NAME: truncated: $(grep -o 'skip-checkpoint .*' "$WORK/cut2/events.log" | cut -c 1-160)"

# 5. The final save fails: not exit 0.
if [ "$(id -u)" = 0 ] && mkdir -p "$WORK/mnt" && mount -t tmpfs -o size=16m tmpfs "$WORK/mnt" 2>/dev/null; then
  trap 'umount "$WORK/mnt" 2>/dev/null || umount -l "$WORK/mnt"; cleanup' EXIT
  rm -f "$OB_INJECT_RELEASE"  # parked before step 15 until the disk is full
  run_start full 20 --ckpt-dir "$WORK/mnt/ck" --ckpt-every 10 --inject "$(park 15)"
  committed() { grep -q " checkpoint step=9 " "$WORK/full/events.log" 2>/dev/null; }
  wait_for 60 committed || fail "no checkpoint of step 9: $(tail -3 "$WORK/full.err")"
  dd if=/dev/zero of="$WORK/mnt/filler" bs=64k 2>/dev/null
  touch "$OB_INJECT_RELEASE"
  run_wait
  [ "$RC" = 74 ] || fail "final save on a full disk: exit $RC, expected 74: $(tail -3 "$WORK/full.err")"
  grep -q "the checkpoint of step 19 failed (.*No space left on device.*); the latest good one is .*/step-000000000009" \
    "$WORK/full.err" || fail "the failure does not name the latest good checkpoint: $(tail -3 "$WORK/full.err")"
  grep -q " done exit 74" "$WORK/full/events.log" || fail "events.log: $(tail -2 "$WORK/full/events.log")"
else
  echo "$NAME: full disk: skipped (needs root to mount a tmpfs)"
fi
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
