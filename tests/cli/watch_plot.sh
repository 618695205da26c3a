# ob-watch --plot: a well-formed SVG with every rank's polyline in both
# panels, one line per event and a legend.
source "$(dirname "$0")/../lib/assert.sh"
WATCH="$OB_BIN/ob-watch"
"$OB_BIN/watch_synth" --steps 250 --seed 7 --slow 1:1.5:60:160 --crash 2:200 > "$TMP/run.pb"
"$WATCH" --json --plot "$TMP/run.svg" "$TMP/run.pb" > "$TMP/events.jsonl" 2>/dev/null
[ $? = 1 ] && pass || fail "expected exit 1 (anomalies)"
python3 - "$TMP/run.svg" "$TMP/events.jsonl" <<'PY' && pass || fail "bad SVG"
import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
events = [json.loads(l) for l in open(sys.argv[2])]
# Generation 1: ranks 0-3; the crash of rank 2 (pipeline 1) leaves 2 ranks in generation 2.
series = {(p.get("data-generation"), p.get("data-rank")) for p in root.iter(ns + "polyline")}
assert series == {("1", "0"), ("1", "1"), ("1", "2"), ("1", "3"), ("2", "0"), ("2", "1")}, series
for panel in ("panel-step", "panel-compute"):
    g = [e for e in root.iter(ns + "g") if e.get("id") == panel]
    assert len(g) == 1, panel
    lines = g[0].findall(ns + "polyline")
    assert len(lines) == 6, (panel, len(lines))
    for l in lines:
        pts = l.get("points").split()
        assert len(pts) >= 40, len(pts)
        for p in pts:
            x, y = map(float, p.split(","))
            assert 60 <= x <= 840 and 0 <= y <= 1000, p
    marks = [l for l in g[0].findall(ns + "line") if l.get("class") == "event"]
    assert len(marks) == len(events), (len(marks), len(events))
kinds = {e["kind"] for e in events}
assert {"EVENT_STRAGGLER", "EVENT_CRASH", "EVENT_RECOVERY"} <= kinds, kinds
text = " ".join(t.text or "" for t in root.iter(ns + "text"))
for word in ("step time (s)", "compute: forward + backward (s)", "step", "ranks", "events",
             "node2 · rank 1 · gen 1", "straggler node2 r1", "crash node3 r2"):
    assert word in text, word
PY
# An empty stream still draws (empty) axes.
: > "$TMP/empty.pb"
expect 0 '' -- "$WATCH" --plot "$TMP/empty.svg" "$TMP/empty.pb"
python3 -c 'import sys, xml.etree.ElementTree as ET; ET.parse(sys.argv[1])' "$TMP/empty.svg" && pass || fail "empty SVG"
expect 74 'nodir/x.svg' -- "$WATCH" --plot "$TMP/nodir/x.svg" "$TMP/empty.pb"
finish
