# ob-ckpt ls, show and prune: what a person sees of a checkpoint root, and
# retention that never deletes the newest complete checkpoint, the one
# `latest` names, or one being written.
source "$(dirname "$0")/../lib/assert.sh"
CKPT="$OB_BIN/ob-ckpt"
"$OB_BIN/ckpt_writer" --dir "$TMP/ck" --layers 4 --writers 2 --steps 6 > "$TMP/writer.out" || fail "ckpt_writer"
[ "$(tail -1 "$TMP/writer.out")" = "committed 6" ] && pass || fail "writer: $(cat "$TMP/writer.out")"
# A save being written (step 7), and a damaged committed one (step 5).
mkdir "$TMP/ck/step-000000000007.partial"
cp "$TMP/ck/step-000000000006/layer-0000.safetensors" "$TMP/ck/step-000000000007.partial/"
rm "$TMP/ck/step-000000000005/layer-0002.safetensors"

expect 0 '' -- "$CKPT" ls "$TMP/ck"
grep -Eq '^ +6 +[0-9.]+ KiB +complete +\* step-000000000006$' "$TMP/out" && pass || fail "ls latest row: $(cat "$TMP/out")"
grep -Eq '^ +5 +[0-9.]+ KiB +incomplete +step-000000000005$' "$TMP/out" && pass || fail "ls damaged row: $(cat "$TMP/out")"
grep -Eq '^ +7 +[0-9.]+ KiB +incomplete +step-000000000007.partial$' "$TMP/out" && pass || fail "ls partial row: $(cat "$TMP/out")"
[ "$(grep -vc '^#' "$TMP/out")" = 7 ] && pass || fail "ls: expected 7 rows: $(cat "$TMP/out")"
grep -q '^# 7 checkpoints, 5 complete$' "$TMP/out" && pass || fail "ls footer: $(cat "$TMP/out")"

expect 0 '' -- "$CKPT" ls --json "$TMP/ck"
python3 - "$TMP/out" <<'PY' && pass || fail "ls --json: $(cat "$TMP/out")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
assert [r["complete"] for r in rows] == [True] * 4 + [False, True, False]
assert [r["latest"] for r in rows] == [False] * 5 + [True, False]
assert all(r["bytes"] > 0 for r in rows)
PY

# show: the latest of a root, or a given checkpoint; text or JSON.
expect 0 '' -- "$CKPT" show "$TMP/ck"
grep -Eq '^step +6$' "$TMP/out" && grep -Eq '^layers +4$' "$TMP/out" && \
  grep -Eq '^ 3 +[0-9.]+ KiB +xxh3:[0-9a-f]{16} +layer-0003.safetensors$' "$TMP/out" && pass || fail "show: $(cat "$TMP/out")"
expect 0 '' -- "$CKPT" show --json "$TMP/ck/step-000000000002"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); assert m["step"]=="2" and len(m["files"])==4 and m["num_layers"]==4' "$TMP/out" \
  && pass || fail "show --json: $(cat "$TMP/out")"
expect 65 'step-000000000007.partial/manifest.pb: missing' -- "$CKPT" show "$TMP/ck/step-000000000007.partial"

# prune --keep 3: removes 1, 2 (and not the damaged 5, nor the partial 7).
expect 0 '' -- "$CKPT" prune "$TMP/ck" --keep 3
[ "$(cat "$TMP/out")" = "removed $TMP/ck/step-000000000001
removed $TMP/ck/step-000000000002" ] && pass || fail "prune --keep 3 output: $(cat "$TMP/out")"
for s in 3 4 5 6; do [ -d "$TMP/ck/step-00000000000$s" ] && pass || fail "prune removed step $s"; done
[ -d "$TMP/ck/step-000000000007.partial" ] && pass || fail "prune removed a partial"
# latest names an older one: it stays; the newest complete one always stays.
echo step-000000000003 > "$TMP/ck/latest"
expect 0 '' -- "$CKPT" prune "$TMP/ck" --keep 1
[ "$(cat "$TMP/out")" = "removed $TMP/ck/step-000000000004" ] && pass || fail "prune --keep 1: $(cat "$TMP/out")"
[ -d "$TMP/ck/step-000000000003" ] && [ -d "$TMP/ck/step-000000000006" ] && [ -d "$TMP/ck/step-000000000007.partial" ] \
  && pass || fail "prune --keep 1 removed too much: $(ls "$TMP/ck")"
expect 0 '' -- "$CKPT" verify "$TMP/ck/step-000000000006"

# Bad input: one line naming the problem.
expect 64 'at least 1' -- "$CKPT" prune "$TMP/ck" --keep 0
expect 64 'keep is required' -- "$CKPT" prune "$TMP/ck"
expect 64 'no command' -- "$CKPT"
expect 64 "try 'ob-ckpt --help'" -- "$CKPT" frobnicate "$TMP/ck"
expect 66 'nowhere: cannot open: No such file or directory' -- "$CKPT" ls "$TMP/nowhere"
# A file inside a checkpoint, not a checkpoint ("cannot open: Not a directory" before).
expect 66 'manifest.pb: not a directory \(give a checkpoint, DIR/step-…, or the directory that holds them\)' -- \
  "$CKPT" verify "$TMP/ck/step-000000000006/manifest.pb"
mkdir "$TMP/empty"
expect 0 '' -- "$CKPT" ls "$TMP/empty"
grep -q '^# 0 checkpoints, 0 complete$' "$TMP/out" && pass || fail "ls of an empty root: $(cat "$TMP/out")"
expect 66 'empty: no complete checkpoint' -- "$CKPT" show "$TMP/empty"
expect 66 'empty: no complete checkpoint' -- "$CKPT" export "$TMP/empty" -o "$TMP/x.safetensors"
finish
