# A save that runs out of space (a small tmpfs) reports "No space left on
# device", leaves no temporary file, and leaves the previous checkpoint
# intact and `latest` unchanged. Needs root to mount; exits 77 (skipped)
# when the mount is refused.
source "$(dirname "$0")/../lib/assert.sh"
CKPT="$OB_BIN/ob-ckpt"
WRITER="$OB_BIN/ckpt_writer"
MNT="$TMP/mnt"
mkdir -p "$MNT"
if ! mount -t tmpfs -o size=1m tmpfs "$MNT" 2> /dev/null; then
  echo "skipped: cannot mount a tmpfs (needs root)"; exit 77
fi
trap 'umount "$MNT" 2> /dev/null || umount -l "$MNT"; rm -rf "$TMP"' EXIT
D="$MNT/ck"
# A step: 5 weights of 64 x 256 F32, each with two Adam moments, ~960 KiB:
# step 1 fits in 1 MiB, step 2 does not.
ARGS=(--dir "$D" --layers 4 --writers 2 --rows 64 --cols 256)
expect 0 '' -- "$WRITER" "${ARGS[@]}" --steps 1
[ "$(cat "$D/latest")" = step-000000000001 ] && pass || fail "first save: latest is $(cat "$D/latest")"

expect 74 'No space left on device' -- "$WRITER" "${ARGS[@]}" --steps 1
grep -q 'step-000000000002.partial/layer-000[0-3].safetensors: write failed: No space left on device' "$TMP/err" \
  && pass || fail "the error does not name the file: $(cat "$TMP/err")"
[ "$(cat "$D/latest")" = step-000000000001 ] && pass || fail "latest moved to $(cat "$D/latest")"
[ -z "$(find "$D" -name '*.tmp*')" ] && pass || fail "temporary files left: $(find "$D" -name '*.tmp*')"
[ ! -e "$D/step-000000000002" ] && pass || fail "a step-2 directory exists"
expect 0 '' -- "$CKPT" verify "$D/step-000000000001"
expect 0 '' -- "$CKPT" ls "$D"
grep -Eq '^ +1 .* complete +\* step-000000000001$' "$TMP/out" && pass || fail "ls: $(cat "$TMP/out")"
grep -Eq '^ +2 .* incomplete +step-000000000002.partial$' "$TMP/out" && pass || fail "ls: $(cat "$TMP/out")"

# With the disk filled up, even a tiny save fails cleanly.
dd if=/dev/zero of="$MNT/filler" bs=4k 2> /dev/null
expect 74 'No space left on device' -- "$WRITER" --dir "$D" --layers 4 --writers 2 --rows 1 --cols 1 --steps 1
[ "$(cat "$D/latest")" = step-000000000001 ] && pass || fail "latest moved to $(cat "$D/latest")"
# Space again: the next run clears the half-written save and goes on.
rm -f "$MNT/filler"
expect 0 '' -- "$WRITER" --dir "$D" --layers 4 --writers 2 --rows 1 --cols 1 --steps 1
[ "$(cat "$D/latest")" = step-000000000002 ] && pass || fail "after space was freed, latest is $(cat "$D/latest")"
expect 0 '' -- "$CKPT" verify "$D"
grep -q '^ok: 2 checkpoints, 8 files' "$TMP/out" && pass || fail "verify: $(cat "$TMP/out")"
finish
