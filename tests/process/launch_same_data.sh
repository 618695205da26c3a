#!/usr/bin/env bash
# Every host reads the same tokens (lib/ob/launch/worker/inputs.h): gpt-tiny on 4
# hosts (2 pipelines x 2 stages) whose agents run through an --rsh that
# gives host 4 a file of its own at the --data path (a bind mount in a
# mount namespace of its own: what a stale copy on one node looks like).
#  1. host 4's copy differs from the others' in 16 bytes, with the same
#     size and modification time: the run ends at once with exit 65,
#     naming host 4, the file and both fingerprints, without a recovery.
#     Before 2026-11-28 it trained host 4's stage on other targets than
#     its pipeline's inputs and exited 0.
#  2. host 4's copy is malformed (an odd size for uint16 tokens): exit 65
#     with the file's own error, without a recovery (before: three
#     recoveries that completed no step, and exit 75, as if a later attempt
#     might not meet it).
#  3. the master cannot read the file (it exists only on the hosts): the
#     first worker's copy is the job's; with host 4's different, exit 65
#     naming a worker as the reader whose copy the job took; with every
#     host's the same, the run trains to the end, and its checkpoint
#     records the workers' fingerprint of the file and their sum of every
#     byte;
#  4. a resume of that checkpoint, the master still without the file, on
#     hosts that all hold another file now: exit 65, naming the job that
#     saved the checkpoint as the reader (before 2026-11-28 the job's
#     identity was not checked without the master's own reading, and it
#     trained on);
#  5. a --ckpt-dir that host 4 holds on a disk of its own (an empty tmpfs
#     there): exit 78 before any step, naming host 4 and the directory.
#     Before 2026-11-28 the run trained and exited 0: its checkpoint was
#     complete only because this layout has the first pipeline (hosts 1
#     and 2) write every layer, and a recovery on host 4 from it would have
#     found nothing there;
#  6. the file rewritten in place after step 10 (16 bytes changed; the
#     mapping reads the new bytes): exit 65, naming the file and both its
#     sizes and times, without a recovery. Before 2026-11-29 the run
#     trained on the new bytes and exited 0, its checkpoints recording the
#     old file's fingerprint;
#  7. a chmod, then a new file renamed into place after step 10 (how ob's
#     tools write): the workers read the file they map again (its metadata
#     changed) and find its bytes the same, their mappings keep the old
#     one, and the run trains to the end and exits 0;
#  8. host 4's copy of a 3 MiB file differs from the others' in 16 bytes
#     of its middle, where the fingerprint (size, first and last MiB) does
#     not look, and has another modification time (a copy made later):
#     its workers read it whole, and the run ends at once with exit 65,
#     naming host 4 and both sums over every byte. Before 2026-12-01 it
#     trained host 4's stage on other targets and exited 0;
#  9. the same copy with the master's size and modification time to the
#     nanosecond (so its workers take the master's facts and read only its
#     ends before training): one of host 4's workers reads it whole in the
#     background, and the run ends between two steps with exit 65, naming
#     host 4 and both sums, without a recovery. Before 2026-12-01, exit 0.
# 10. checkpoints committed while host 4's copy is still being compared:
#     a run of 10 steps with host 4 holding the job's file saves step 9;
#     resumed with host 4 holding the copy of part 9, whose background read
#     gives its verdict only at step 30 (--inject RANK:check=30: a large
#     file), checkpoints every 5 steps. Those committed after step 9 (14,
#     19, ...) record host 4's copy as unchecked in their manifests; the
#     run ends with exit 65 and refutes each (REFUTED, kept). Resumed again with host 4 mended,
#     --resume auto passes over the refuted ones (a skip-checkpoint line
#     each), resumes step 9 and trains to the end. Before 2026-12-02 those
#     checkpoints were committed as good, and the last resume took the
#     newest of them, trained on host 4's bytes.
#     The same copy with the master killed (-9) after step 44's checkpoint,
#     before any verdict: that checkpoint lists the copy and is not
#     refuted. A run with host 4 mended resumes it, and its checkpoints (49,
#     54) list host 4's old copy too: they descend from its bytes. A run
#     with that copy back on host 4 judges it, exits 65 and refutes 44, 49
#     and 54 (before: 49 and 54 listed nothing and stayed good).
# 11. the file rewritten in place after step 10 and its time set back
#     (`touch -r`): the same size and time to the nanosecond, so only its
#     ctime moved; every host reads the file it maps again, and the run
#     ends with exit 65 naming both sums, without a recovery. Before
#     2026-12-02 it trained on the new bytes and exited 0.
NAME=launch_same_data
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
[ "$(id -u)" = 0 ] || skip "not root: no mount namespaces for per-host files"
unshare -m true 2>/dev/null || skip "unshare -m does not work here"
make_two_by_two

DATA="$WORK/data"
mkdir -p "$DATA"
cp "$OB_SOURCE_DIR/tests/data/corpus.txt" "$DATA/train.txt"
# Same size, same mtime, 16 bytes changed in the middle.
python3 - "$DATA/train.txt" "$DATA/other.txt" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
m = len(b) // 2
b[m:m + 16] = bytes((x + 1) % 256 for x in b[m:m + 16])
open(sys.argv[2], "wb").write(bytes(b))
PY
touch -r "$DATA/train.txt" "$DATA/other.txt"
# uint16 token files: the corpus's bytes as ids, and one with an odd size.
python3 - "$DATA/train.txt" "$DATA/good.bin" "$DATA/odd.bin" <<'PY'
import struct, sys
ids = open(sys.argv[1], "rb").read()[:20000]
open(sys.argv[2], "wb").write(struct.pack("<%dH" % len(ids), *ids))
open(sys.argv[3], "wb").write(struct.pack("<%dH" % len(ids), *ids) + b"\0")
PY

# The rsh: host 4's agent (and so its workers) sees $OTHER at $AT; the
# others see this test's file system. SELF_PID: this shell, whose mount
# namespace, root and directory the agents of a master started in a
# namespace of its own (part 3) enter (its root: in a chroot, as
# check-libtorch2 runs this, entering the namespace alone would leave it).
cat > "$WORK/rsh" <<'SH'
#!/usr/bin/env bash
host=$1; shift
enter=()
[ -n "${SELF_PID:-}" ] && enter=(nsenter -t "$SELF_PID" -m -r -w)
case $host in
  *h4|${ALL:-none})
    exec "${enter[@]}" unshare -m bash -c \
      'if [ "$OTHER" = tmpfs ]; then mount -t tmpfs none "$AT"; else mount --bind "$OTHER" "$AT"; fi && exec "$@"' \
      rsh "$@" ;;
  *) exec "${enter[@]}" "$@" ;;
esac
SH
chmod +x "$WORK/rsh"

# launch RUN DATA STEPS [FLAGS...]: ob-launch through the rsh, in the
# background (MASTER_PID), run by the command in PREFIX (none by default).
PREFIX=()
launch() {
  local run=$1 data=$2 steps=$3
  shift 3
  rm -rf "${WORK:?}/$run"
  timeout 120 "${PREFIX[@]}" "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind 127.0.0.1 \
    --secret-file "$WORK/secret" --run-dir "$WORK/$run" --steps "$steps" --data "$data" "$@" \
    "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/$run.err" &
  MASTER_PID=$!
}
# bump_middle FILE [REF]: 16 bytes of its middle changed in place (the
# same inode, its size kept: what a mapping of it then reads); with REF,
# its times set back to REF's at once after (touch -r, microseconds later).
bump_middle() {
  python3 - "$@" <<'PY'
import os, sys
with open(sys.argv[1], "r+b") as f:
    m = os.path.getsize(sys.argv[1]) // 2
    f.seek(m)
    b = f.read(16)
    f.seek(m)
    f.write(bytes((x + 1) % 256 for x in b))
if len(sys.argv) > 2:
    ref = os.stat(sys.argv[2])
    os.utime(sys.argv[1], ns=(ref.st_atime_ns, ref.st_mtime_ns))
PY
}
# refused RUN WHAT PATTERN: the run exited 65 with a last line matching
# PATTERN, recovered nothing, and left no process.
refused() {
  local run=$1 what=$2 pattern=$3
  run_wait
  [ "$RC" = 65 ] || fail "$what: exit $RC, expected 65: $(grep -E 'error|ob-launch:' "$WORK/$run.err" | tail -3)"
  local line
  line=$(tail -1 "$WORK/$run.err")
  [[ "$line" =~ $pattern ]] || fail "$what: last line: $line"
  [ "$(grep -c ' start-workers ' "$WORK/$run/events.log")" = 1 ] \
    || fail "$what: workers were restarted: $(grep -E ' (decide|start-workers) ' "$WORK/$run/events.log")"
  wait_for 5 no_tagged || fail "$what: processes left: $(tagged | xargs -r ps -o pid,args -p)"
  echo "$NAME: $what: $line"
}

# 1. Another copy on host 4.
OTHER="$DATA/other.txt" AT="$DATA/train.txt" launch copy "$DATA/train.txt" 30
refused copy "another copy on host 4" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h4 exit status 65: --data $DATA/train.txt on host ${TAG}h4 is not the file the job reads: bytes=[0-9]+ xxh3=[0-9a-f]{16} here, bytes=[0-9]+ xxh3=[0-9a-f]{16} as the master read it \(every host must read the same tokens"

# 2. A malformed copy on host 4.
OTHER="$DATA/odd.bin" AT="$DATA/good.bin" launch odd "$DATA/good.bin" 30
refused odd "a malformed copy on host 4" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h4 exit status 65: $DATA/good.bin: size [0-9]+ bytes is not a multiple of 2.*; not restarting what fails the same way again$"

# 3. The master cannot read the file: it runs where $DATA is an empty
# directory, and its agents in this shell's mount namespace.
export SELF_PID=$$
PREFIX=(unshare -m bash -c 'mount -t tmpfs none "$0" && exec "$@"' "$DATA")
OTHER="$DATA/other.txt" AT="$DATA/train.txt" launch hosts "$DATA/train.txt" 30
refused hosts "the master without the file, another copy on host 4" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h[1-4] exit status 65: --data $DATA/train.txt on host ${TAG}h[1-4] is not the file the job reads: .* as rank [0-9] on host ${TAG}h[1-4] read it"
OTHER="$DATA/train.txt" AT="$DATA/train.txt" launch same "$DATA/train.txt" 5 --ckpt-dir "$WORK/ck"
run_wait
[ "$RC" = 0 ] || fail "the master without the file, the same on every host: exit $RC: $(tail -3 "$WORK/same.err")"
grep -q "trained 5 steps" "$WORK/same.err" || fail "the same file everywhere: $(tail -2 "$WORK/same.err")"
# The workers' readings are the job's, in its manifest: the fingerprint,
# and the sum over every byte (they read their copies whole).
"$OB_BIN/ob-ckpt" show --json "$WORK/ck" > "$WORK/same.manifest.json" || fail "ob-ckpt show"
grep -Eq '"data_fingerprint": "bytes=[0-9]+ xxh3=[0-9a-f]{16}"' "$WORK/same.manifest.json" \
  && grep -Eq '"data_sum": "xxh3=[0-9a-f]{16}"' "$WORK/same.manifest.json" \
  || fail "the workers' reading not in the manifest: $(grep -A5 '"job"' "$WORK/same.manifest.json")"
wait_for 5 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"

# 4. Its checkpoint resumed, every host now holding another file.
ALL="*" OTHER="$DATA/other.txt" AT="$DATA/train.txt" launch resumed "$DATA/train.txt" 10 --ckpt-dir "$WORK/ck" \
  --resume auto
refused resumed "a resume on hosts that all hold another file" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h[1-4] exit status 65: --data $DATA/train.txt on host ${TAG}h[1-4] is not the file the job reads: .* as the job that saved $WORK/ck/step-000000000004 read it"

# 5. A checkpoint directory host 4 holds on its own disk.
PREFIX=()
mkdir -p "$WORK/ck5"
OTHER=tmpfs AT="$WORK/ck5" launch local "$DATA/train.txt" 30 --ckpt-dir "$WORK/ck5"
run_wait
[ "$RC" = 78 ] || fail "a checkpoint directory of host 4's own: exit $RC, expected 78: $(grep -E 'ob-launch:' "$WORK/local.err" | tail -2)"
line=$(grep "^ob-launch: " "$WORK/local.err" | tail -1)
[[ "$line" =~ ^ob-launch:\ worker\ rank\ [0-9]\ on\ host\ ${TAG}h4\ exit\ status\ 78:\ --ckpt-dir\ $WORK/ck5\ on\ host\ ${TAG}h4\ is\ not\ the\ directory\ the\ master\ saves\ into:\ no\ \.lock\ of\ the\ master\'s\ there ]] \
  || fail "a checkpoint directory of host 4's own: $line"
[ "$(grep -c ' start-workers ' "$WORK/local/events.log")" = 1 ] || fail "a checkpoint directory of host 4's own: restarted"
wait_for 5 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: a checkpoint directory of host 4's own: $line"

# 6. Rewritten in place while the run reads it (every host sees this
# file: host 4's bind mount is of the file onto itself).
cp "$DATA/train.txt" "$DATA/live.txt"
OTHER="$DATA/live.txt" AT="$DATA/live.txt" launch inplace "$DATA/live.txt" 3000 --metrics "$WORK/inplace.pb"
wait_step inplace 10 || fail "the file rewritten in place: no step 10: $(tail -3 "$WORK/inplace.err")"
bump_middle "$DATA/live.txt"
refused inplace "the file rewritten in place" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h[1-4] exit status 65: $DATA/live.txt: rewritten while the run read it \([0-9]+ bytes modified [0-9: -]+ UTC when opened, now [0-9]+ bytes modified [0-9: -]+ UTC\): the tokens read since are not the job's data"

# 7. A new file renamed into place: the run keeps the one it mapped.
cp "$DATA/train.txt" "$DATA/live.txt"
OTHER="$DATA/live.txt" AT="$DATA/live.txt" launch renamed "$DATA/live.txt" 40 --metrics "$WORK/renamed.pb"
wait_step renamed 10 || fail "a file renamed into place: no step 10: $(tail -3 "$WORK/renamed.err")"
chmod 0600 "$DATA/live.txt"  # its metadata alone: read again, the same bytes
cp "$DATA/other.txt" "$DATA/live.new" && mv "$DATA/live.new" "$DATA/live.txt"
run_wait
[ "$RC" = 0 ] || fail "a file renamed into place: exit $RC: $(tail -3 "$WORK/renamed.err")"
grep -q "trained 40 steps" "$WORK/renamed.err" || fail "a file renamed into place: $(tail -2 "$WORK/renamed.err")"
wait_for 5 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: a file renamed into place: $(grep -o 'trained 40 steps: final loss [0-9.]*' "$WORK/renamed.err")"

# 8. Another middle on host 4, the ends the same.
python3 - "$DATA/train.txt" "$DATA/big.txt" "$DATA/big-other.txt" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b = (b * (3 * 2**20 // len(b) + 1))[:3 * 2**20]
open(sys.argv[2], "wb").write(bytes(b))
m = len(b) // 2
b[m:m + 16] = bytes((x + 1) % 256 for x in b[m:m + 16])
open(sys.argv[3], "wb").write(bytes(b))
PY
touch -d '-1 hour' "$DATA/big.txt"
OTHER="$DATA/big-other.txt" AT="$DATA/big.txt" launch middle "$DATA/big.txt" 30
refused middle "another middle on host 4" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h4 exit status 65: --data $DATA/big.txt on host ${TAG}h4 is not the file the job reads: its bytes differ, though its size and ends may agree: xxh3=[0-9a-f]{16} over every byte here, xxh3=[0-9a-f]{16} over every byte as the master read it \(every host must read the same tokens"

# 9. The same, with the master's size and time.
touch -r "$DATA/big.txt" "$DATA/big-other.txt"
OTHER="$DATA/big-other.txt" AT="$DATA/big.txt" launch facts "$DATA/big.txt" 3000
refused facts "another middle on host 4, the master's size and time" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h4 exit status 65: --data $DATA/big.txt on host ${TAG}h4 is not the file the job reads: its bytes differ, though its size and ends may agree: xxh3=[0-9a-f]{16} over every byte here, xxh3=[0-9a-f]{16} over every byte as the master read it \(every host must read the same tokens"
# 10. Checkpoints committed while host 4's copy is compared.
CK10=(--ckpt-dir "$WORK/ck10" --ckpt-every 5)
OTHER="$DATA/big.txt" AT="$DATA/big.txt" launch before "$DATA/big.txt" 10 "${CK10[@]}"
run_wait
[ "$RC" = 0 ] || fail "10 steps on the job's file: exit $RC: $(tail -3 "$WORK/before.err")"
OTHER="$DATA/big-other.txt" AT="$DATA/big.txt" launch held "$DATA/big.txt" 60 "${CK10[@]}" --resume auto \
  --inject "0:check=30;1:check=30;2:check=30;3:check=30"
refused held "checkpoints committed while host 4's copy was compared" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h4 exit status 65: --data $DATA/big.txt on host ${TAG}h4 is not the file the job reads: its bytes differ"
# Every checkpoint committed after step 9 (14, 19, ...: those whose
# parts were all written before rank 3 exited) is refuted, and said.
held=()
for d in "$WORK"/ck10/step-*; do
  case ${d##*/} in *.*) continue ;; esac  # being written
  s=$((10#${d##*step-}))
  [ "$s" -gt 9 ] && [ -e "$d/manifest.pb" ] && held+=("$s")
done
[ "${#held[@]}" -ge 1 ] && [ "${held[0]}" = 14 ] || fail "no checkpoint committed after step 9: $(ls "$WORK/ck10")"
grep -q "refuted the checkpoint.* of steps\? ${held[0]}.* in $WORK/ck10: they trained on a host's copy of --data whose bytes are not the job's" "$WORK/held.err" \
  || fail "not refuted: $(grep -E 'refute|checkpoint' "$WORK/held.err" | tail -5)"
[ "$(grep -c ' refute-checkpoint step=' "$WORK/held/events.log")" = "${#held[@]}" ] \
  || fail "refute-checkpoint lines for ${held[*]}: $(grep refute "$WORK/held/events.log")"
for s in "${held[@]}"; do
  d=$(printf '%s/step-%012d' "$WORK/ck10" "$s")
  grep -q "^trained while host ${TAG}h4's copy of --data $DATA/big.txt was still being compared with the job's, and its bytes differ$" "$d/REFUTED" \
    || fail "step $s: REFUTED: $(cat "$d/REFUTED" 2>&1)"
  "$OB_BIN/ob-ckpt" show --json "$d" | grep -q "\"host\": \"${TAG}h4\"" || fail "step $s: no unchecked copy in its manifest"
done
"$OB_BIN/ob-ckpt" show --json "$WORK/ck10/step-000000000009" | grep -q '"host"' \
  && fail "step 9 (host 4 held the job's file) records an unchecked copy"
"$OB_BIN/ob-ckpt" ls "$WORK/ck10" > "$WORK/ck10.ls" || fail "ob-ckpt ls"
n=${#held[@]}
[ "$(grep -c ' refuted ' "$WORK/ck10.ls")" = "$n" ] && grep -q "checkpoints, $((n + 2)) complete, $n of them refuted" "$WORK/ck10.ls" \
  && grep -q '^  *9 .* \* step-000000000009$' "$WORK/ck10.ls" \
  || fail "ob-ckpt ls: $(cat "$WORK/ck10.ls")"
"$OB_BIN/ob-ckpt" verify "$WORK/ck10/step-000000000014" 2> "$WORK/ck10.verify" && fail "ob-ckpt verify took a refuted checkpoint"
grep -q "refuted: trained while host ${TAG}h4's copy" "$WORK/ck10.verify" || fail "ob-ckpt verify: $(cat "$WORK/ck10.verify")"
OTHER="$DATA/big.txt" AT="$DATA/big.txt" launch mended "$DATA/big.txt" 40 "${CK10[@]}" --resume auto
run_wait
[ "$RC" = 0 ] || fail "resumed with host 4 mended: exit $RC: $(tail -3 "$WORK/mended.err")"
grep -q " resume generation=1 from .*step-0*9$" "$WORK/mended/events.log" \
  || fail "did not resume from step 9: $(grep -E 'resume|skip' "$WORK/mended/events.log")"
[ "$(grep -c ' skip-checkpoint .*: refuted: trained while host' "$WORK/mended/events.log")" = "$n" ] \
  || fail "skip-checkpoint lines: $(grep skip "$WORK/mended/events.log")"
wait_for 5 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: checkpoints committed while host 4's copy was compared: refuted ${held[*]}, resumed step 9"

# 10b. The same copy, the master killed before the verdict: nobody judged it.
OTHER="$DATA/big-other.txt" AT="$DATA/big.txt" launch killed "$DATA/big.txt" 400 "${CK10[@]}" --resume auto \
  --inject "0:check=1000;1:check=1000;2:check=1000;3:check=1000"
wait_for 60 grep -q " checkpoint step=44 " "$WORK/killed/events.log" \
  || fail "killed: no checkpoint of step 44: $(tail -3 "$WORK/killed.err")"
pkill -9 -P "$MASTER_PID" -x ob-launch || fail "killed: no master under $MASTER_PID"  # (under timeout)
run_wait
wait_for 20 no_tagged || fail "killed: processes left: $(tagged | xargs -r ps -o pid,args -p)"
ck() { printf '%s/step-%012d' "$WORK/ck10" "$1"; }
"$OB_BIN/ob-ckpt" show --json "$(ck 44)" | grep -q "\"host\": \"${TAG}h4\"" || fail "step 44: no unchecked copy"
[ -e "$(ck 44)/REFUTED" ] && fail "step 44 refuted with nobody to judge its copy"
# Host 4 mended: its old copy is not there to judge; the checkpoints
# descended from step 44 list it all the same.
OTHER="$DATA/big.txt" AT="$DATA/big.txt" launch heir "$DATA/big.txt" 55 "${CK10[@]}" --resume auto
run_wait
[ "$RC" = 0 ] || fail "heir: exit $RC: $(tail -3 "$WORK/heir.err")"
grep -q " resume generation=1 from .*step-0*44$" "$WORK/heir/events.log" || fail "heir: not resumed from 44"
for s in 49 54; do
  "$OB_BIN/ob-ckpt" show --json "$(ck $s)" | grep -q "\"host\": \"${TAG}h4\"" \
    || fail "step $s, descended from step 44, does not list host 4's unchecked copy"
done
# That copy back on host 4, and judged: every checkpoint that came
# through its bytes is refuted.
OTHER="$DATA/big-other.txt" AT="$DATA/big.txt" launch judged "$DATA/big.txt" 400 "${CK10[@]}" --resume auto
refused judged "host 4's old copy judged at last" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h4 exit status 65: --data $DATA/big.txt on host ${TAG}h4 is not the file the job reads: its bytes differ"
for s in 44 49 54; do
  [ -e "$(ck $s)/REFUTED" ] || fail "step $s, trained through host 4's copy, not refuted: $(grep refute "$WORK/judged/events.log")"
done
echo "$NAME: a copy judged by a later run: refuted 44, 49, 54"
# 11. Rewritten in place with its time set back.
cp "$DATA/train.txt" "$DATA/back.txt" && touch -d '-2 hours' "$DATA/back.txt" && cp -p "$DATA/back.txt" "$DATA/back.ref"
OTHER="$DATA/back.txt" AT="$DATA/back.txt" launch back "$DATA/back.txt" 3000 --metrics "$WORK/back.pb"
wait_step back 10 || fail "rewritten, its time set back: no step 10: $(tail -3 "$WORK/back.err")"
bump_middle "$DATA/back.txt" "$DATA/back.ref"
# (A step whose check falls between the write and the time set back sees
# the new time: the other refusal, as true.)
refused back "rewritten in place, its time set back" \
  "^ob-launch: worker rank [0-9] on host ${TAG}h[1-4] exit status 65: (--data $DATA/back.txt on host ${TAG}h[1-4] is not the file the job reads: its bytes differ|$DATA/back.txt: rewritten while the run read it)"
echo "$NAME: ok"
