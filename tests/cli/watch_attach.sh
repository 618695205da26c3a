# ob-watch --attach RUN_DIR [--act]: reads the metrics a master streams on
# RUN_DIR/control.sock after the line "watch", and asks it, on the same
# socket, to exclude a hung host or a confirmed straggler's, or to roll
# back after a NaN loss — with the evidence, a cool-down, and every action
# recorded as an EVENT_ACTION. A fake master (python) plays ob-launch.
source "$(dirname "$0")/../lib/assert.sh"
WATCH="$OB_BIN/ob-watch"
SYNTH="$OB_BIN/watch_synth"

# fake_master DIR STREAM [ANSWER]: serves DIR/control.sock; "watch" gets
# STREAM then EOF; any other line is appended to DIR/requests and answered
# with ANSWER (default ok). Stops once it has streamed and no request came
# for a second.
fake_master() {
  python3 - "$@" <<'PY' &
import os, socket, sys, threading, time
run, stream = sys.argv[1], sys.argv[2]
answer = sys.argv[3] if len(sys.argv) > 3 else '{"ok":true,"error":"","state":"running"}'
path = os.path.join(run, "control.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path + ".tmp"); os.rename(path + ".tmp", path); s.listen(8)
s.settimeout(0.2)
last = [time.time()]
watched = [False]
def serve(c):
    f = c.makefile("rb")
    for line in f:
        line = line.decode().rstrip("\n")
        last[0] = time.time()
        if line == "watch":
            if answer.startswith("OLD"):
                c.sendall(b'{"ok":false,"error":"unknown request \'watch\'"}\n'); break
            c.sendall(open(stream, "rb").read()); watched[0] = True; break
        with open(os.path.join(run, "requests"), "a") as r:
            r.write(line + "\n")
        c.sendall((answer + "\n").encode())
    c.close()
while time.time() - last[0] < 1 or not watched[0] and time.time() - last[0] < 10:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
}
wait_socket() { for _ in $(seq 100); do [ -S "$1/control.sock" ] && return 0; sleep 0.05; done; return 1; }

# A straggler (node3, from step 30), then rank 1 stops at step 150.
"$SYNTH" --steps 200 --seed 2 --slow 2:1.6:30 --stop 1:150 > "$TMP/run.pb"
mkdir "$TMP/run"
fake_master "$TMP/run" "$TMP/run.pb"
MASTER=$!
wait_socket "$TMP/run" || fail "the fake master did not start"
# The recording plays in an instant: the records' own clock decides hangs.
"$WATCH" --attach "$TMP/run" --act --clock stream --json > "$TMP/events" 2> "$TMP/log"
rc=$?
wait "$MASTER"
[ "$rc" = 1 ] && pass || fail "ob-watch exited $rc: $(cat "$TMP/log")"
python3 - "$TMP/events" "$TMP/run/requests" <<'PY' && pass || fail "actions: $(cat "$TMP/run/requests" 2>&1)"
import json, re, sys
events = [json.loads(l) for l in open(sys.argv[1])]
requests = open(sys.argv[2]).read().splitlines()
# The straggler's host is excluded after 3 straggler events, once (cool-down);
# the hung rank's host at once.
assert len(requests) == 2, requests
assert re.match(r"exclude node3 slow=1\.[5-7][0-9]* straggler: node3 rank 2 ", requests[0]), requests[0]
assert requests[1].startswith("exclude node2 hang: node2 rank 1 hangs"), requests[1]
kinds = [e["kind"] for e in events]
actions = [e for e in events if e["kind"] == "EVENT_ACTION"]
assert len(actions) == 2, kinds
first_straggler_steps = [int(e["step"]) for e in events if e["kind"] == "EVENT_STRAGGLER"][:3]
a = actions[0]
assert a["host"] == "node3" and a["rank"] == 2 and a["request"] == requests[0], a
assert int(a["step"]) == first_straggler_steps[2], (a["step"], first_straggler_steps)
assert a["evidence"]["ok"] == 1 and a["evidence"]["confirmations"] == 3 and a["evidence"]["ratio"] > 1.3, a
assert a["response"].startswith('{"ok":true'), a
assert "asked the master to exclude host node3" in a["message"], a["message"]
# Each action follows the event that confirmed it.
i = kinds.index("EVENT_ACTION")
assert kinds[i - 1] == "EVENT_STRAGGLER", kinds
assert kinds[kinds.index("EVENT_HANG") + 1] == "EVENT_ACTION", kinds
PY
grep -q 'action: asked the master to exclude host node3' "$TMP/log" && pass || fail "no action line on stderr: $(cat "$TMP/log")"

# A NaN loss asks for a rollback; the master may refuse, and that is recorded.
"$SYNTH" --steps 80 --seed 3 --nan 60 > "$TMP/nan.pb"
mkdir "$TMP/run2"
fake_master "$TMP/run2" "$TMP/nan.pb" '{"ok":false,"error":"no checkpoint to roll back to"}'
MASTER=$!
wait_socket "$TMP/run2" || fail "the fake master did not start"
"$WATCH" --attach "$TMP/run2" --act --json > "$TMP/events2" 2> "$TMP/log2"
wait "$MASTER"
grep -q '^rollback loss_nan: loss is NaN at step 60' "$TMP/run2/requests" && pass || fail "no rollback request"
grep -q '"kind":"EVENT_ACTION","severity":"SEVERITY_CRITICAL".*refused: no checkpoint to roll back to' "$TMP/events2" \
  && pass || fail "the refusal is not recorded: $(cat "$TMP/events2")"

# --dry-run decides without a socket; without --act there is no request.
"$WATCH" --act --dry-run --json "$TMP/run.pb" > "$TMP/out" 2> "$TMP/err"
[ "$(grep -c '"kind":"EVENT_ACTION"' "$TMP/out")" = 2 ] && grep -q '"ok":-1' "$TMP/out" && pass \
  || fail "dry run: $(grep EVENT_ACTION "$TMP/out")"
[ "$(grep -c 'would ask the master' "$TMP/err")" = 2 ] && pass || fail "dry run log: $(cat "$TMP/err")"

# Nothing listening: 69 naming the socket; a master that does not stream: 69.
mkdir "$TMP/none"
expect 69 'none/control.sock: cannot connect' -- "$WATCH" --attach "$TMP/none"
mkdir "$TMP/old"
fake_master "$TMP/old" "$TMP/nan.pb" OLD
MASTER=$!
wait_socket "$TMP/old" || fail "the fake master did not start"
expect 69 'does not stream metrics: .*unknown request' -- "$WATCH" --attach "$TMP/old"
kill "$MASTER" 2>/dev/null; wait "$MASTER" 2>/dev/null

# Usage errors.
expect 64 'needs the master.s control socket' -- "$WATCH" --act "$TMP/run.pb"
expect 64 '--dry-run goes with --act' -- "$WATCH" --dry-run "$TMP/run.pb"
expect 64 'not both' -- "$WATCH" --attach "$TMP/run" "$TMP/run.pb"
expect 64 "'wall' or 'stream'" -- "$WATCH" --clock sundial "$TMP/run.pb"
# Infinite or NaN figures: a detector that never fires, or fires at once.
expect 64 'hang-timeout must be a positive, finite number' -- "$WATCH" --hang-timeout inf "$TMP/run.pb"
expect 64 'cooldown must be finite, not negative' -- "$WATCH" --cooldown nan "$TMP/run.pb"
expect 64 'cooldown must be finite, not negative' -- "$WATCH" --stall-timeout inf "$TMP/run.pb"
expect 64 'straggler-ratio must be above 1' -- "$WATCH" --straggler-ratio inf "$TMP/run.pb"
expect 64 'straggler-votes' -- "$WATCH" --straggler-votes 9 "$TMP/run.pb"

# A file is a record of the past: acted on, a replayed NaN of step 60
# rolled a live run at step 194 back to its checkpoint of step 149. Refused
# by name and on stdin; a pipe is live, and acts.
mkdir "$TMP/run3"
expect 64 "--act acts on a live run, and .*nan.pb is a file, a record of the past" -- \
  "$WATCH" --act --control "$TMP/run3/control.sock" "$TMP/nan.pb"
expect 64 "--act acts on a live run, and <stdin> is a file" -- \
  "$WATCH" --act --control "$TMP/run3/control.sock" < "$TMP/nan.pb"
[ ! -e "$TMP/run3/requests" ] && pass || fail "a refused --act sent $(cat "$TMP/run3/requests")"
fake_master "$TMP/run3" "$TMP/nan.pb"
MASTER=$!
wait_socket "$TMP/run3" || fail "the fake master did not start"
cat "$TMP/nan.pb" | "$WATCH" --act --control "$TMP/run3/control.sock" --json > "$TMP/events3" 2> "$TMP/log3"
kill "$MASTER" 2>/dev/null; wait "$MASTER" 2>/dev/null
grep -q '^rollback loss_nan: loss is NaN at step 60' "$TMP/run3/requests" && pass \
  || fail "a piped stream did not act: $(cat "$TMP/log3")"
finish
