#!/usr/bin/env bash
# Straggler precision and recall of ob-watch.
#
#   bench/watch_accuracy.sh [--runs N]
#       Synthetic runs (build/bench/ob-watch-accuracy): N slowed and N clean
#       runs per noise level and slowdown; seconds.
#
#   bench/watch_accuracy.sh --real [--runs N] [--slow F] [--steps S]
#       REAL RUNS: N local trainings of gpt-tiny on 4 hosts (2 pipelines of
#       2 stages, ob-launch --rsh local) with a random rank slowed F times
#       (ob-launch --inject RANK:slow=F, default 1.5), each metrics stream
#       read by ob-watch. Reports, per run, the injected rank and host, the
#       first straggler event and its latency in steps; then precision
#       (straggler events on the injected rank / all straggler events) and
#       recall (runs flagged on the right rank within 20 steps of the first
#       slowed step). Minutes; needs ob-launch built with LibTorch.
#
# Binaries come from build/ (OB_BIN for bin/, OB_BENCH for bench/).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OB_SOURCE_DIR=${OB_SOURCE_DIR:-$(dirname "$HERE")}
OB_BIN=${OB_BIN:-$OB_SOURCE_DIR/build/bin}
OB_BENCH=${OB_BENCH:-$(dirname "$OB_BIN")/bench}
real=0 runs=20 slow=1.5 steps=60
while [ $# -gt 0 ]; do
  case $1 in
    --real) real=1 ;;
    --runs) runs=$2; shift ;;
    --slow) slow=$2; shift ;;
    --steps) steps=$2; shift ;;
    *) echo "usage: $0 [--real] [--runs N] [--slow F] [--steps S]" >&2; exit 64 ;;
  esac
  shift
done

if [ "$real" = 0 ]; then
  exec "$OB_BENCH/ob-watch-accuracy" --runs "$runs"
fi

# --- real runs --------------------------------------------------------------
NAME=watch_accuracy
export OB_BIN OB_SOURCE_DIR
source "$OB_SOURCE_DIR/tests/lib/launch.sh"
"$OB_BIN/ob-launch" --help | grep -q -- --inject || skip "this ob-launch has no --inject"
make_pipelines 4 1
echo "# ob-watch straggler accuracy on real runs: gpt-tiny, 2x2 pipelines on 4 local hosts,"
echo "# $steps steps a run, one random rank slowed ${slow}x from the start (ob-launch --inject)"
printf '#%4s %5s %-14s %6s %6s %8s %8s %s\n' run rank host events right first latency generations
right=0 all=0 in_time=0 runs_left=$runs
for ((i = 1; i <= runs; i++)); do
  rank=$((RANDOM % 4))
  timeout 600 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run$i" \
    --steps "$steps" --data "$OB_SOURCE_DIR/README.md" --metrics "$WORK/m$i.pb" \
    --inject "$rank:slow=$slow" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err$i" \
    || fail "run $i: ob-launch exited $?: $(tail -3 "$WORK/err$i")"
  "$OB_BIN/ob-watch" --json "$WORK/m$i.pb" > "$WORK/e$i.jsonl" 2>/dev/null
  read -r host n ok first latency gens < <(python3 - "$WORK/m$i.pb" "$WORK/e$i.jsonl" "$rank" "$METRICS_PY" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[4].rsplit("/", 1)[0])
import metrics
rank = int(sys.argv[3])
host, first_step, gens = "?", None, set()
for _, f in metrics.frames(open(sys.argv[1], "rb").read(), sys.argv[1]):
    gens.add(f.get(metrics.GENERATION, 0))
    if f.get(metrics.RANK, 0) == rank and f.get(metrics.GENERATION, 1) == 1 and 2 in f and not f.get(metrics.HEARTBEAT):
        host = f[2].decode()
        if first_step is None: first_step = f.get(metrics.STEP, 0)
ev = [json.loads(l) for l in open(sys.argv[2]) if '"EVENT_STRAGGLER"' in l]
ok = sum(1 for e in ev if e["rank"] == rank)
mine = [int(e["step"]) for e in ev if e["rank"] == rank]
first = mine[0] if mine else -1
latency = first - (first_step or 0) if mine else -1
print(host, len(ev), ok, first, latency, len(gens))
PY
)
  printf ' %4d %5d %-14s %6d %6d %8d %8d %d\n' "$i" "$rank" "$host" "$n" "$ok" "$first" "$latency" "$gens"
  # A run that recovered (a host lost under load) is not the experiment.
  [ "$gens" = 1 ] || { echo "#   run $i: $gens generations (a recovery); left out"; runs_left=$((runs_left - 1)); continue; }
  right=$((right + ok)); all=$((all + n))
  if [ "$latency" -ge 0 ] && [ "$latency" -lt 20 ]; then in_time=$((in_time + 1)); fi
done
python3 -c "import sys; r, a, t, n = map(int, sys.argv[1:]); print('# precision %.3f (%d of %d straggler events on the slowed rank), recall within 20 steps %.3f (%d of %d runs)' % (r / a if a else 1.0, r, a, t / n if n else 0, t, n))" \
  "$right" "$all" "$in_time" "$runs_left"
