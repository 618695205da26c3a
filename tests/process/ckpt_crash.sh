# Crash safety of checkpoints: 100 seeded trials kill -9 a writer
# (tests/tools/ckpt_writer: 3 writer threads, then a commit, step after step,
# pruning to 3) at a random moment, then restart it on the same directory.
# After every kill: `ob-ckpt ls` lists no incomplete checkpoint as complete,
# `latest` names a complete checkpoint, and `verify` passes on it and on every
# committed checkpoint. OB_CKPT_SEED and OB_CKPT_TRIALS override the defaults.
source "$(dirname "$0")/../lib/assert.sh"
CKPT="$OB_BIN/ob-ckpt"
WRITER="$OB_BIN/ckpt_writer"
SEED=${OB_CKPT_SEED:-1234}
TRIALS=${OB_CKPT_TRIALS:-100}
RANDOM=$SEED
D="$TMP/ck"
mid_save=0   # kills that left a save half-written
start=$SECONDS

check() {
  local trial=$1
  [ -d "$D" ] || return 0  # killed before it made anything
  if ! "$CKPT" ls --json "$D" > "$TMP/ls.json" 2> "$TMP/ls.err"; then
    fail "trial $trial: ls: $(cat "$TMP/ls.err")"; return
  fi
  if grep -q '\.partial","bytes":[0-9]*,"complete":true' "$TMP/ls.json"; then
    fail "trial $trial: a .partial checkpoint listed as complete: $(cat "$TMP/ls.json")"; return
  fi
  grep -q '\.partial"' "$TMP/ls.json" && mid_save=$((mid_save + 1))
  if grep -q '"complete":true' "$TMP/ls.json"; then
    # Every committed checkpoint (not only the complete ones: a step-N
    # directory that is not complete would be a failure) is intact.
    if ! "$CKPT" verify -q "$D" > /dev/null 2> "$TMP/verify.err"; then
      fail "trial $trial: verify: $(cat "$TMP/verify.err")"; return
    fi
  fi
  if [ -e "$D/latest" ]; then
    local name; name=$(cat "$D/latest")
    if ! grep -q "/$name\",\"bytes\":[0-9]*,\"complete\":true,\"latest\":true" "$TMP/ls.json"; then
      fail "trial $trial: latest names '$name', not a complete checkpoint: $(cat "$TMP/ls.json")"; return
    fi
    if ! "$CKPT" verify -q "$D/$name" > /dev/null 2> "$TMP/verify.err"; then
      fail "trial $trial: verify latest: $(cat "$TMP/verify.err")"; return
    fi
  fi  # no latest yet: killed between the first commit's rename and `latest`
  pass
}

for trial in $(seq 1 "$TRIALS"); do
  # 0-199 ms: start-up, clean-up, writes, commits, prunes (a save of
  # these small tensors takes some 10-60 ms, mostly fsync).
  delay=$(printf '0.%03d' $((RANDOM % 200)))
  "$WRITER" --dir "$D" --layers 6 --writers 3 --steps 1000000 --keep 3 > /dev/null 2> "$TMP/writer.err" &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  rc=$?
  # 137: killed; anything else means the writer stopped by itself: an error.
  if [ "$rc" != 137 ]; then fail "trial $trial: writer exited $rc: $(cat "$TMP/writer.err")"; fi
  check "$trial"
done

# The trials made progress across restarts and often cut a save in half.
last=$(sed 's/step-0*//' "$D/latest")
[ "${last:-0}" -ge $((TRIALS / 4)) ] && pass || fail "only ${last:-0} steps committed over $TRIALS trials"
[ "$mid_save" -ge $((TRIALS / 10)) ] && pass || fail "only $mid_save of $TRIALS kills landed in a save"
echo "# seed $SEED: $TRIALS kills, $mid_save mid-save, latest step $last, $((SECONDS - start)) s"
finish
