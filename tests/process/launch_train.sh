# ob-launch trains for real: 4 local hosts, gpt-tiny split into 2 pipelines
# of 2 stages (memory forces n0 = 2), 30 steps on README.md's bytes. The run
# exits 0, every rank reports every step, all ranks agree on the loss, the
# loss falls, and the closing line gives the final loss and throughput.
NAME=launch_train
source "$(dirname "$0")/../lib/launch.sh"
make_two_by_two

timeout 120 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run" \
  --steps 30 --data "$OB_SOURCE_DIR/README.md" --metrics "$WORK/metrics.pb" \
  "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
MASTER_PID=$!
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 0 ] || fail "ob-launch exited $rc: $(tail -5 "$WORK/err")"
grep -q "trained 30 steps: final loss [0-9.]*, [0-9]* tokens/s" "$WORK/err" || fail "no closing line: $(tail -3 "$WORK/err")"

python3 - "$WORK/metrics.pb" <<'PY' || fail "metrics"
import struct, sys
data = open(sys.argv[1], "rb").read()
def varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7f) << s; s += 7
        if c < 0x80: return v, i
recs, i = [], 0
while i < len(data):
    n, i = varint(data, i)
    body, i = data[i:i + n], i + n
    f, j = {}, 0
    while j < len(body):
        key, j = varint(body, j)
        num, wt = key >> 3, key & 7
        if wt == 0: f[num], j = varint(body, j)
        elif wt == 1: f[num] = struct.unpack("<d", body[j:j + 8])[0]; j += 8
        elif wt == 2: ln, j = varint(body, j); f[num] = body[j:j + ln]; j += ln
        else: raise SystemExit(f"wire type {wt}")
    recs.append(f)
ranks = {r.get(3, 0) for r in recs}
assert ranks == {0, 1, 2, 3}, ranks
by_step = {}
for r in recs: by_step.setdefault(r.get(6, 0), []).append(r.get(13, 0.0))
assert sorted(by_step) == list(range(30)), sorted(by_step)
for s, losses in by_step.items():
    assert len(losses) == 4 and max(losses) - min(losses) < 1e-9 * max(losses), (s, losses)
first, last = by_step[0][0], by_step[29][0]
print(f"loss {first:.4f} -> {last:.4f}")
assert last < 0.8 * first, (first, last)
PY
[ -z "$(tagged)" ] || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
