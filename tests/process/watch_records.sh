#!/usr/bin/env bash
# Readable metrics (issue 12, acceptance 2): the metrics of a real run (2
# local hosts, 12 steps) through `ob-watch --records json` parse with
# Python's json module line by line, one object per record, with every
# field metrics.proto declares (nested messages too) and the values the
# binary records hold; `--records csv` loads with Python's csv module, a
# column per field, the same values.
NAME=watch_records
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
make_cluster 2
reference_run 12

"$OB_BIN/ob-watch" --records json "$WORK/ref.pb" > "$WORK/ref.jsonl" 2> "$WORK/json.err" \
  || fail "--records json: $(cat "$WORK/json.err")"
"$OB_BIN/ob-watch" --records csv -o "$WORK/ref.csv" "$WORK/ref.pb" 2> "$WORK/csv.err" \
  || fail "--records csv: $(cat "$WORK/csv.err")"
# The stream on stdin, as from a pipe, gives the same.
"$OB_BIN/ob-watch" --records json < "$WORK/ref.pb" | cmp -s - "$WORK/ref.jsonl" || fail "stdin gave other JSON"

python3 - "$OB_SOURCE_DIR/tests/lib" "$OB_SOURCE_DIR/lib/proto/ob/metrics.proto" "$WORK/ref.pb" \
  "$WORK/ref.jsonl" "$WORK/ref.csv" <<'PY' || fail "the records do not read back"
import csv, json, math, re, sys
sys.path.insert(0, sys.argv[1])
import metrics
proto, pb, jsonl, csvf = sys.argv[2:]

# The fields metrics.proto declares, by message, in field-number order.
text = re.sub(r"//[^\n]*", "", open(proto).read())
messages = {}
for name, body in re.findall(r"message\s+(\w+)\s*\{([^}]*)\}", text):
    fields = re.findall(r"(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body)
    messages[name] = [(t, n, int(num)) for t, n, num in sorted(fields, key=lambda f: int(f[2]))]
top = messages["Metrics"]

def flat(msg, prefix=""):
    out = []
    for t, n, _ in messages[msg]:
        out += flat(t, prefix + n + ".") if t in messages else [prefix + n]
    return out

frames = [f for _, f in metrics.frames(open(pb, "rb").read())]
lines = open(jsonl).read().splitlines()
assert len(lines) == len(frames) > 12, (len(lines), len(frames))
steps = 0
for line, f in zip(lines, frames):
    o = json.loads(line)
    assert [k for k in o] == [n for _, n, _ in top], list(o)
    for t, n, num in top:
        if t in messages:
            assert list(o[n]) == [m for _, m, _ in messages[t]], (n, list(o[n]))
    for num, key in ((metrics.RANK, "rank"), (metrics.STEP, "step"), (metrics.GENERATION, "generation")):
        assert o[key] == f.get(num, 0), (key, o[key], f.get(num, 0))
    loss = f.get(metrics.LOSS, 0.0)
    assert (o["loss"] is None) if math.isnan(loss) else o["loss"] == loss, (o["loss"], loss)
    assert o["heartbeat"] == bool(f.get(metrics.HEARTBEAT, 0))
    assert o["host"] == f.get(metrics.HOST, b"").decode()
    steps += not o["heartbeat"] and o["exit"]["description"] == ""
assert steps == 24, steps  # 12 steps x 2 ranks

with open(csvf, newline="") as fh:
    rows = list(csv.DictReader(fh))
    fh.seek(0)
    header = next(csv.reader(fh))
assert header == flat("Metrics"), header
assert len(rows) == len(frames), (len(rows), len(frames))
for row, line in zip(rows, lines):
    o = json.loads(line)
    assert int(row["step"]) == o["step"] and int(row["rank"]) == o["rank"]
    assert int(row["checkpoint.step"]) == o["checkpoint"]["step"]
    loss = float(row["loss"])
    assert (o["loss"] is None and math.isnan(loss)) or loss == o["loss"], (row["loss"], o["loss"])
    assert row["phase"] == o["phase"] and row["heartbeat"] in ("true", "false")
print(f"{len(lines)} records, {len(top)} fields, {len(header)} columns")
PY
echo "$NAME: $(python3 -c 'import sys; print(sum(1 for _ in open(sys.argv[1])))' "$WORK/ref.jsonl") JSON lines and $(($(wc -l < "$WORK/ref.csv") - 1)) CSV rows read back"

# A damaged stream: the records before the damage, then 65 naming the file.
head -c $(( $(stat -c %s "$WORK/ref.pb") / 2 )) "$WORK/ref.pb" > "$WORK/half.pb"
printf '\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01' >> "$WORK/half.pb"
"$OB_BIN/ob-watch" --records csv "$WORK/half.pb" > "$WORK/half.csv" 2> "$WORK/half.err"
rc=$?
[ "$rc" = 65 ] && grep -q "half.pb" "$WORK/half.err" && [ "$(wc -l < "$WORK/half.csv")" -gt 2 ] \
  || fail "damaged stream: exit $rc, $(wc -l < "$WORK/half.csv") lines: $(cat "$WORK/half.err")"
"$OB_BIN/ob-watch" --records xml "$WORK/ref.pb" > /dev/null 2> "$WORK/xml.err"
rc=$?
[ "$rc" = 64 ] && [ "$(grep -c . "$WORK/xml.err")" = 1 ] || fail "--records xml: exit $rc: $(cat "$WORK/xml.err")"
echo "$NAME: ok"
