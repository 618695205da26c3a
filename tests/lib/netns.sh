# Network namespaces for tests/process/*.sh: make them, wire them, check
# they reach each other, and remove them (with whatever still runs inside)
# on the way out.
#
# Source after defining skip() (exit 77) and fail() (exit 1), call
# netns_require, and put netns_cleanup in the EXIT trap before making
# anything: namespaces and root-namespace links made here are recorded and
# netns_cleanup removes them on every path, failure included. Every command
# here is bounded.

NETNS_MADE=()      # namespaces made by netns_add
NETNS_LINKS=()     # links made in the root namespace (bridges, veth ends)
declare -A NETNS_ADDR=()     # netns_star: namespace -> its address
declare -A NETNS_HOSTDEV=()  # netns_star: namespace -> its link's root-namespace end
NETNS_GATEWAY=""             # netns_star: the bridge's address

# netns_require [TOOL...]: skips unless root with `ip` (and each TOOL).
netns_require() {
  [ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
  command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
  local t
  for t in "$@"; do command -v "$t" >/dev/null || skip "no '$t' command"; done
}

# netns_add NAME...: new namespaces with lo up. Skips when the first one
# cannot be made (no namespace support here); fails on a later one.
netns_add() {
  local n
  for n in "$@"; do
    if ! ip netns add "$n" 2>/dev/null; then
      [ ${#NETNS_MADE[@]} = 0 ] && skip "'ip netns add' failed (no namespace support?)"
      fail "ip netns add $n"
    fi
    NETNS_MADE+=("$n")
    ip -n "$n" link set lo up || fail "lo up in $n"
  done
}

# netns_cleanup: SIGKILLs every process still inside our namespaces, then
# deletes them and our root-namespace links. Safe to call more than once.
# Root-side veth ends are deleted explicitly: a deleted namespace lives on
# in the kernel (with its end of the pair) while sockets opened in it wait
# out their TCP timers, which across a cut link takes minutes.
netns_cleanup() {
  local n pid
  for n in "${NETNS_MADE[@]}"; do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  for n in "${NETNS_MADE[@]}"; do ip netns del "$n" 2>/dev/null; done
  for n in "${NETNS_LINKS[@]}"; do ip link del "$n" 2>/dev/null; done
  NETNS_MADE=() NETNS_LINKS=()
}

# netns_veth NS_A DEV_A NS_B DEV_B: a veth pair between two of our
# namespaces, both ends up (addresses and routes are the caller's).
netns_veth() {
  ip link add "$2" netns "$1" type veth peer name "$4" netns "$3" || fail "veth $1 <-> $3"
  ip -n "$1" link set "$2" up || fail "up $2 in $1"
  ip -n "$3" link set "$4" up || fail "up $4 in $3"
}

# netns_star NS...: a bridge in the root namespace at 10.R.0.1/24, and each
# namespace I (from 0) joined to it by a veth pair: eth0 at 10.R.0.(I+2)
# inside, NETNS_HOSTDEV[NS] on the bridge. R is random and claimed by
# creating the bridge "ob<R>br", so concurrent tests do not clash; subnets
# already routed here are passed over. Sets NETNS_GATEWAY and NETNS_ADDR.
netns_star() {
  [ $# -le 250 ] || fail "netns_star: too many namespaces"
  local r="" try br
  for try in $(seq 40); do
    try=$(( RANDOM % 200 + 30 ))
    ip -4 route show table all 2>/dev/null | grep -Eq "(^| )10\.$try\." && continue
    br="ob${try}br"
    ip link add "$br" type bridge 2>/dev/null || continue   # taken: another run has R
    r=$try
    break
  done
  [ -n "$r" ] || fail "netns_star: no free 10.R.0.0/24 subnet after 40 tries"
  NETNS_LINKS+=("$br")
  NETNS_GATEWAY="10.$r.0.1"
  ip addr add "$NETNS_GATEWAY/24" dev "$br" || fail "address on $br"
  ip link set "$br" up || fail "up $br"
  local i=0 n dev
  for n in "$@"; do
    dev="ob${r}v$i"
    NETNS_ADDR[$n]="10.$r.0.$((i + 2))"
    NETNS_HOSTDEV[$n]=$dev
    ip link add "$dev" type veth peer name eth0 netns "$n" || fail "veth $dev <-> $n"
    NETNS_LINKS+=("$dev")
    ip link set "$dev" master "$br" || fail "$dev onto $br"
    ip link set "$dev" up || fail "up $dev"
    ip -n "$n" addr add "${NETNS_ADDR[$n]}/24" dev eth0 || fail "address in $n"
    ip -n "$n" link set eth0 up || fail "up eth0 in $n"
    i=$((i + 1))
  done
}

# netns_star_ready NS...: netns_star, then every namespace must reach the
# bridge and the first the last (skipped, 77, where bridged traffic is
# filtered by br_netfilter).
netns_star_ready() {
  netns_star "$@"
  local h first=$1 last=${!#}
  for h in "$@"; do
    netns_reachable "$h" "$NETNS_GATEWAY" || fail "setup: $h cannot reach the bridge at $NETNS_GATEWAY"
  done
  if ! netns_reachable "$first" "${NETNS_ADDR[$last]}"; then
    [ "$(sysctl -n net.bridge.bridge-nf-call-iptables 2>/dev/null)" = 1 ] \
      && skip "bridged traffic between namespaces is filtered here (br_netfilter with iptables rules)"
    fail "setup: $first cannot reach $last at ${NETNS_ADDR[$last]}"
  fi
}

# netns_reachable NS ADDR: true when ADDR answers from inside NS within 3 s
# (a refused connection proves the peer is reachable). Needs python3.
netns_reachable() {
  ip netns exec "$1" python3 -c '
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    pass' "$2" 2>/dev/null
}

# netns_rsh FILE: writes FILE, an --rsh command (`FILE HOST CMD...`) that
# runs CMD in namespace HOST the way ssh runs a remote command over a network
# that can fail. `ip netns exec` alone runs CMD as the caller's own child:
# killing it, or closing its stdin, reaches CMD at once, even across a cut
# link. Here CMD runs in a session of its own; killing FILE's process (or
# its group) does not reach it, and its stdin is the first line of FILE's
# (ob-launch's secret) followed by nothing, held open until CMD exits. FILE
# exits with CMD's status (128 + N for signal N). Needs python3.
netns_rsh() {
  cat > "$1" <<'PY' || fail "cannot write $1"
#!/usr/bin/env python3
import os, sys
host, cmd = sys.argv[1], sys.argv[2:]
first = sys.stdin.buffer.readline()
status_r, status_w = os.pipe()
if os.fork() == 0:                     # the "remote" side: outlives this process
    os.setsid()
    os.close(status_r)
    stdin_r, stdin_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(stdin_r, 0)
        os.closerange(3, 1 << 16)
        os.execvp("ip", ["ip", "netns", "exec", host] + cmd)
    os.close(stdin_r)
    os.write(stdin_w, first)           # stdin_w stays open while CMD runs
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:
        os.write(status_w, bytes([128 - code if code < 0 else code & 0xff]))
    except OSError:
        pass                           # the local side was killed: nobody asks
    os._exit(0)
os.close(status_w)
b = os.read(status_r, 1)
sys.exit(b[0] if b else 255)
PY
  chmod +x "$1" || fail "chmod $1"
}

# netns_train_to STEPS CUT_STEP: the four hosts of $WORK/hosts.txt in
# namespaces on a star, ob-launch training $WORK/plan.pb there for STEPS
# steps on the fixed corpus (master on the bridge, agents through
# netns_rsh), until it reaches CUT_STEP with no failure detected. Sets
# MASTER_PID, `hosts` (the host names) and `events` (the run's events.log);
# run directory $WORK/run, metrics $WORK/metrics.pb, stderr $WORK/err.
netns_train_to() {
  local steps=$1 cut_step=$2
  mapfile -t hosts < "$WORK/hosts.txt"
  netns_add "${hosts[@]}"
  netns_star_ready "${hosts[@]}"
  netns_rsh "$WORK/rsh"
  "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind "$NETNS_GATEWAY" --secret-file "$WORK/secret" \
    --run-dir "$WORK/run" --steps "$steps" --data "$OB_SOURCE_DIR/tests/data/corpus.txt" \
    --metrics "$WORK/metrics.pb" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
  MASTER_PID=$!
  events="$WORK/run/events.log"
  _netns_at() { [ "$(max_step "$WORK/metrics.pb")" -ge "$1" ] || ! kill -0 "$MASTER_PID" 2>/dev/null; }
  wait_for 90 _netns_at "$cut_step" || fail "no step $cut_step in 90 s: $(tail -3 "$WORK/err")"
  kill -0 "$MASTER_PID" 2>/dev/null || fail "the master exited before step $cut_step: $(tail -3 "$WORK/err")"
  ! grep -q " detect " "$events" || fail "a failure was detected before step $cut_step: $(grep " detect " "$events")"
}
