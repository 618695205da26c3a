# Beyond f: with f = 1 and two pipelines of two stages, kill -9 the agents of
# both first stages at once. Every replica of the first stage's layers is
# gone: ob-launch exits 75 within 5 s naming those layers, leaving nothing
# running. (Killing one host only is survivable: launch_recover.sh.)
NAME=launch_lost_layers
source "$(dirname "$0")/../lib/launch.sh"
make_two_by_two
# The first stage of each pipeline, and the layers it holds.
read -r first_a first_b layers < <(python3 - "$WORK/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
pipes = p["instantiation"]["pipelines"]
t = {x["nodes"]: x for x in p["templates"]}[pipes[0]["template_nodes"]]
s = t["stages"][0]
print(pipes[0]["nodes"][0], pipes[1]["nodes"][0], f'{s["first_layer"]}-{s["last_layer"]}')
PY
)

run_and_kill() {  # run_and_kill HOST...: kill those agents once training runs
  rm -rf "$WORK/run"
  "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run" \
    --steps 100000 --data "$OB_SOURCE_DIR/README.md" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
  MASTER_PID=$!
  for _ in $(seq 300); do grep -q "master: info: step" "$WORK/err" && break; sleep 0.1; done
  grep -q "master: info: step" "$WORK/err" || fail "training did not start: $(tail -3 "$WORK/err")"
  local start=$(date +%s%N) h
  for h in "$@"; do pkill -9 -f -- "--host $h\$" || pkill -9 -f -- "--host $h " || fail "no agent for $h"; done
  for _ in $(seq 100); do kill -0 "$MASTER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$MASTER_PID" 2>/dev/null && fail "ob-launch still running 10 s after the kill"
  wait "$MASTER_PID"; RC=$?; MASTER_PID=""
  ELAPSED_MS=$(( ($(date +%s%N) - start) / 1000000 ))
  # (The agents' workers die with them, by PDEATHSIG: on a loaded machine
  # their exits take a while; a fixed half second raced them.)
  wait_for 10 no_tagged || fail "processes left behind: $(tagged | xargs -r ps -o pid,stat,args -p)"
}

run_and_kill "$first_a" "$first_b"
[ "$RC" = 75 ] || fail "both replicas lost: exit $RC, expected 75: $(tail -3 "$WORK/err")"
[ "$ELAPSED_MS" -le 5000 ] || fail "took $ELAPSED_MS ms to stop (limit 5000)"
grep -q "layers $layers have no surviving replica\|layer $layers has no surviving replica\|layers .* no surviving replica" "$WORK/err" \
  || fail "the lost layers ($layers) are not named: $(grep -i replica "$WORK/err")"
grep -q "decide" "$WORK/run/events.log" || fail "no decision in events.log"
echo "$NAME: both first stages lost: exit 75 in $ELAPSED_MS ms, layers $layers named"

echo "$NAME: ok"
