#!/usr/bin/env bash
# Nothing of a job listens beyond --bind, and nothing that steers training
# is readable or writable without the secret (design/launch.md).
# During a real run (2 hosts, one pipeline of 2 stages, so Gloo groups span
# processes): the master's only TCP listener is its control port on the
# bind address (the rendezvous store is no listener of its own); agents
# listen on nothing; the workers' Gloo sockets (the documented exception)
# are on the bind address too, none on a wildcard. A stranger without the
# secret who connects to the control port and sends store requests (get
# ob/gen/1, set ob/gen/2) before or instead of the handshake, a partial
# frame, frames announcing 1 GiB, or 100 connections each holding 2 MiB of
# an unfinished frame, gets no store reply and is cut off; the master's
# memory does not grow by more than a few MB; and the run
# finishes every step with exit 0 on generation 1.
NAME=launch_store
source "$(dirname "$0")/../lib/launch.sh"
export OB_INJECT_RELEASE="$WORK/release"
command -v ss >/dev/null || skip "no ss"
ss -ltnpH >/dev/null 2>&1 || skip "ss -ltnpH does not work here"
make_pipelines 2 0

# The run is held at step PARK (every rank parked, --inject park, until
# $WORK/release exists) while the stranger acts: whatever this machine's
# speed, training is still going when the stranger is done.
STEPS=20 PARK=5
run_start run "$STEPS" --inject "0:park=$PARK;1:park=$PARK"
# Gloo's listeners live while groups form: sample them until the first step.
: > "$WORK/ss.txt"
until [ "$(max_step "$WORK/run.pb")" -ge 1 ]; do
  kill -0 "$MASTER_PID" 2>/dev/null || fail "no step 1: $(tail -3 "$WORK/run.err")"
  ss -ltnpH >> "$WORK/ss.txt"
  sleep 0.02
done
ss -ltnpH > "$WORK/ss.now"
mpid=$(pgrep -P "$MASTER_PID" -x ob-launch | head -1)
[ -n "$mpid" ] || fail "no master process"
addr=$(grep ' listen ' "$WORK/run/events.log" | head -1 | awk '{print $4}')
port=${addr##*:}

# --- listeners ---------------------------------------------------------------
cat "$WORK/ss.now" >> "$WORK/ss.txt"
sort -u -o "$WORK/ss.txt" "$WORK/ss.txt"
grep -F "pid=$mpid," "$WORK/ss.txt" | awk '{print $4}' | sort -u > "$WORK/ss.master" || true
[ "$(grep -c . "$WORK/ss.master")" = 1 ] ||
  fail "the master listens on more than its control port: $(grep -F "pid=$mpid," "$WORK/ss.now")"
grep -qx "127.0.0.1:$port" "$WORK/ss.master" ||
  fail "the master's listener is not the control port on --bind (127.0.0.1:$port): $(cat "$WORK/ss.master")"
for p in $(tagged); do
  grep -F "pid=$p," "$WORK/ss.txt" >> "$WORK/ss.job" || true
done
for p in $(pgrep -f -- "--agent .*--host $TAG"); do
  ! grep -qF "pid=$p," "$WORK/ss.txt" || fail "agent $p listens: $(grep -F "pid=$p," "$WORK/ss.txt")"
done
if [ -s "$WORK/ss.job" ]; then
  awk '{print $4}' "$WORK/ss.job" | grep -v '^127\.0\.0\.1:' > "$WORK/ss.wide" || true
  [ ! -s "$WORK/ss.wide" ] || fail "the job listens beyond --bind: $(cat "$WORK/ss.job")"
fi
echo "$NAME: the master listens only on $addr; the job's other listeners seen (Gloo's, while groups form): $(awk '{print $4}' "$WORK/ss.job" 2>/dev/null | sort -u | grep -c .), none beyond 127.0.0.1"

# --- a stranger on the control port ------------------------------------------
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$mpid/status"; }
rss_before=$(rss)
python3 - 127.0.0.1 "$port" "${TAG}h1" "$mpid" > "$WORK/stranger.out" 2>&1 <<'PY' || fail "stranger: $(cat "$WORK/stranger.out")"
import os, socket, struct, sys, threading, time

host, port, agent_name, master_pid = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

# Just enough protobuf (control.proto) to speak Control frames.
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out

def ld(num, payload):  # a length-delimited field
    return varint(num << 3 | 2) + varint(len(payload)) + payload

def vi(num, value):  # a varint field
    return varint(num << 3) + varint(value)

def frame(body):
    return struct.pack(">I", len(body)) + body

STORE_SET, STORE_GET = 1, 2
def store_request(op, key, value=b""):
    body = vi(1, 7) + vi(3, op) + ld(4, key.encode()) + vi(8, 1000)
    return ld(13, body + (ld(5, value) if value else b""))  # Control.store_request

def hello(name):
    return ld(1, ld(1, name.encode()) + vi(2, 4242) + vi(3, 1) + ld(4, os.urandom(32)))

def proof(hmac):
    return ld(3, ld(1, hmac))

def read_varint(b, i):
    n = shift = 0
    while True:
        c = b[i]; i += 1
        n |= (c & 0x7F) << shift; shift += 7
        if not c & 0x80:
            return n, i

def kinds(data):
    """The Control kinds (oneof field numbers) of the whole frames in data."""
    out, i = [], 0
    while len(data) - i >= 4:
        n = struct.unpack(">I", data[i:i + 4])[0]
        if len(data) - i - 4 < n:
            break
        body = data[i + 4:i + 4 + n]
        tag, _ = read_varint(body, 0)
        out.append(tag >> 3)
        i += 4 + n
    return out

def session(steps, wait_close=8.0):
    """Sends each step (bytes, or "recv" to read until a frame comes); returns
    (kinds received, seconds until the master closed, or None if it did not)."""
    s = socket.create_connection((host, port), timeout=5)
    got, t0 = b"", time.time()
    try:
        for st in steps:
            if st == "recv":
                s.settimeout(5)
                while not kinds(got):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            else:
                s.sendall(st)
        s.settimeout(wait_close)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return kinds(got), time.time() - t0
            got += chunk
    except socket.timeout:
        return kinds(got), None
    except (ConnectionResetError, BrokenPipeError):
        return kinds(got), time.time() - t0
    finally:
        s.close()

STORE_REPLY, CHALLENGE, REJECT = 14, 2, 5
failures = []
def check(what, result, max_close):
    ks, closed = result
    print(f"{what}: received {ks}, closed after {closed if closed is None else round(closed, 2)} s")
    if STORE_REPLY in ks:
        failures.append(f"{what}: the master answered a store request")
    if closed is None or closed > max_close:
        failures.append(f"{what}: the master did not close the connection within {max_close} s")

get1 = frame(store_request(STORE_GET, "ob/gen/1"))
set2 = frame(store_request(STORE_SET, "ob/gen/2", b"\x08\x02" + b"x" * 64))
check("get ob/gen/1 instead of Hello", session([get1]), 2)
check("set ob/gen/2 instead of Hello", session([set2]), 2)
check("get after Hello, without Proof", session([frame(hello(agent_name)), "recv", get1]), 2)
check("set and get after a wrong Proof",
      session([frame(hello(agent_name)), "recv", frame(proof(os.urandom(32))), set2, get1]), 2)
# A request announced but never completed: cut off by the handshake timeout.
check("partial frame", session([struct.pack(">I", 100) + b"\x00" * 10], wait_close=12), 8)
# 1 GiB announced, and then a flood of bytes that should never be buffered.
def gib():
    try:
        return session([struct.pack(">I", 1 << 30) + b"\x00" * (8 << 20)])
    except (ConnectionResetError, BrokenPipeError):
        return [], 0.0
check("frame announcing 1 GiB", gib(), 2)
results = [None] * 8
def one(i):
    results[i] = gib()
ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
for i, r in enumerate(results):
    check(f"1 GiB frame, connection {i} of 8 at once", r, 4)

# 100 connections at once, each sending most of a frame just under the
# channel's 4 MiB limit and holding it: nothing of it may stay in the master.
def rss_kb():
    with open(f"/proc/{master_pid}/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])
before = rss_kb()
held = []
for i in range(100):
    s = socket.create_connection((host, port), timeout=5)
    try:
        s.sendall(struct.pack(">I", (4 << 20) - 1) + b"\x00" * (2 << 20))
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        pass
    held.append(s)
time.sleep(0.5)
grown = rss_kb() - before
print(f"100 held 2 MiB partial frames: the master grew by {grown} kB")
if grown > 8192:
    failures.append(f"100 held partial frames grew the master by {grown} kB")
for s in held:
    s.close()
if failures:
    print("\n".join(failures))
    sys.exit(1)
PY
cat "$WORK/stranger.out"
rss_after=$(rss)
echo "$NAME: master RSS ${rss_before} kB before the stranger, ${rss_after} kB after"
[ $((rss_after - rss_before)) -le 8192 ] ||
  fail "the master grew by $((rss_after - rss_before)) kB under hostile frames"
kill -0 "$MASTER_PID" 2>/dev/null || fail "the run ended while it was parked"
done_steps=$(max_step "$WORK/run.pb")
[ "$done_steps" = $((PARK - 1)) ] || fail "the run was not parked at step $PARK: its last step $done_steps"
echo "$NAME: the stranger was done with the run parked after step $done_steps; releasing it"
touch "$WORK/release"

# --- the run is undisturbed ------------------------------------------------------
run_wait
[ "$RC" = 0 ] || fail "ob-launch exited $RC: $(tail -5 "$WORK/run.err")"
python3 "$METRICS_PY" check "$WORK/run.pb" "$STEPS" 2 > "$WORK/losses" || fail "metrics: $(cat "$WORK/losses")"
[ "$(grep -c ' start-workers ' "$WORK/run/events.log")" = 1 ] ||
  fail "more than one generation: $(grep -E ' (decide|start-workers) ' "$WORK/run/events.log")"
grep -q "rejected agent connection from 127.0.0.1" "$WORK/run/master.log" ||
  fail "master.log does not record the stranger"
wait_for 3 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
echo "$NAME: ok"
