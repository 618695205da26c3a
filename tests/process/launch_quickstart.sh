#!/usr/bin/env bash
# README's quick start runs from its configuration file: scripts/quickstart
# 3, in a copy of the files it uses (the script, examples/quickstart.yaml,
# README.md), profiles, plans and runs ob-launch --config
# examples/quickstart.yaml --steps 3. The run exits 0 after 3 steps (the
# command line's, not the file's 200) on the four local hosts, into the run
# directory and the metrics file the file names, and its data is the
# file's ../README.md.
NAME=launch_quickstart
source "$(dirname "$0")/../lib/launch.sh"
[ -x "$OB_BIN/ob-profile" ] || skip "no $OB_BIN/ob-profile"
[ -x "$OB_BIN/max_step" ] || skip "no $OB_BIN/max_step"
# The script's hosts are node0..node3, without this test's tag: its
# processes are those working in this test's directory.
tagged() {
  local p
  for p in /proc/[0-9]*; do
    case "$(readlink "$p/cwd" 2> /dev/null)" in "$WORK"*) echo "${p#/proc/}" ;; esac
  done | grep -vx "$$" || true
}

repo=$WORK/repo
mkdir -p "$repo/scripts" "$repo/examples" "$WORK/elsewhere"
cp "$OB_SOURCE_DIR/scripts/quickstart" "$repo/scripts/"
cp "$OB_SOURCE_DIR/examples/quickstart.yaml" "$repo/examples/"
cp "$OB_SOURCE_DIR/README.md" "$repo/"
# Started from another directory: its files still go to the repository's quickstart/.
(cd "$WORK/elsewhere" && OB_BIN="$OB_BIN" timeout 240 bash "$repo/scripts/quickstart" 3 > "$WORK/out" 2> "$WORK/err")
rc=$?
q=$repo/quickstart
[ "$rc" = 0 ] || fail "scripts/quickstart 3 exited $rc: $(tail -5 "$WORK/err")"
grep -q "trained 3 steps: final loss [0-9.]*" "$WORK/err" || fail "no closing line: $(tail -3 "$WORK/err")"
[ -f "$q/run/events.log" ] || fail "no run directory quickstart/run (the file's run-dir): $(ls "$q")"
[ "$("$OB_BIN/max_step" "$q/run.metrics")" = 2 ] \
  || fail "quickstart/run.metrics (the file's metrics) does not end at step 2: $("$OB_BIN/max_step" "$q/run.metrics")"
[ "$(grep -c 'agent-connected' "$q/run/events.log")" = 4 ] || fail "not 4 agents connected"
# The file's data is what the run reads: without it, the same command stops
# before any host starts (exit 66), naming it.
mv "$repo/README.md" "$repo/README.away"
(cd "$q" && timeout 30 "$OB_BIN/ob-launch" --config ../examples/quickstart.yaml --run-dir run-nodata \
  > "$WORK/out-nodata" 2> "$WORK/err-nodata")
rc=$?
[ "$rc" = 66 ] && grep -qx "ob-launch: ../README.md: No such file or directory" "$WORK/err-nodata" \
  || fail "without ../README.md: exit $rc, $(cat "$WORK/err-nodata")"
[ -z "$(ls -A "$WORK/elsewhere")" ] || fail "files left where the script was started: $(ls "$WORK/elsewhere")"
wait_for 5 no_tagged || fail "processes left behind: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: ok"
