#!/usr/bin/env bash
# --bind auto, the default (issue 12, multi-host without traps): four hosts
# in network namespaces on a bridge, named in the hosts file with their
# addr=; ob-launch is given no --bind. The master must listen on the
# bridge's address (the route to the first host), not on loopback, which
# the namespaces cannot reach; the agents connect and gpt-tiny trains 10
# steps with exit 0. With --bind 127.0.0.1 instead, the agents fail
# naming the address they tried and suggesting --bind. A host name that does not resolve with --rsh ssh
# exits 64 at once naming the host and suggesting --bind. Needs root, `ip
# netns` and python3 (exit 77 otherwise); the namespaces go on every path.
NAME=launch_bind_auto
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/netns.sh"
netns_require python3
trap 'cleanup; netns_cleanup' EXIT

make_two_by_two
mapfile -t hosts < "$WORK/hosts.txt"
netns_add "${hosts[@]}"
netns_star_ready "${hosts[@]}"
netns_rsh "$WORK/rsh"
for h in "${hosts[@]}"; do echo "$h addr=${NETNS_ADDR[$h]}"; done > "$WORK/hosts-addr.txt"
timeout 120 "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --secret-file "$WORK/secret" --run-dir "$WORK/run" \
  --steps 10 --data "$OB_SOURCE_DIR/tests/data/corpus.txt" --metrics "$WORK/metrics.pb" \
  "$WORK/plan.pb" "$WORK/hosts-addr.txt" 2> "$WORK/err"
rc=$?
listen=$(grep " listen " "$WORK/run/events.log" | head -1)
[[ "$listen" == *" listen ${NETNS_GATEWAY}:"* ]] || fail "listened on ${listen#* listen } rather than the bridge's ${NETNS_GATEWAY}"
[ "$rc" = 0 ] || fail "exit $rc: $(tail -3 "$WORK/err")"
python3 "$METRICS_PY" check "$WORK/metrics.pb" 10 4 > /dev/null || fail "metrics of 10 steps on 4 ranks"
echo "$NAME: no --bind: listened on ${listen#* listen }, trained 10 steps"

# Loopback given by hand: the namespaces' agents cannot reach it, and say
# which address they tried, with the way out.
timeout 60 "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind 127.0.0.1 --start-timeout 10 --secret-file "$WORK/secret" \
  --run-dir "$WORK/run1" --steps 3 --data "$OB_SOURCE_DIR/tests/data/corpus.txt" \
  "$WORK/plan.pb" "$WORK/hosts-addr.txt" 2> "$WORK/err1"
rc=$?
[ "$rc" != 0 ] || fail "agents reached a master on loopback from their namespaces?"
grep -q "cannot connect to 127.0.0.1:[0-9]*.*give ob-launch --bind ADDR" "$WORK/err1" \
  || fail "exit $rc without the agents' hint: $(tail -4 "$WORK/err1")"
echo "$NAME: --bind 127.0.0.1: exit $rc, $(grep -m1 -o "cannot connect to 127.0.0.1.*" "$WORK/err1")"

echo "no-such-host-$TAG.invalid" > "$WORK/unresolved.txt"
"$OB_BIN/ob-plan" --hosts "$WORK/unresolved.txt" -g 1 -f 0 -B 8 --gpu-memory 1 --overhead-gib 0 \
  -o "$WORK/one.pb" "$WORK/tiny.pb" || fail "ob-plan for one host"
timeout 30 "$OB_BIN/ob-launch" --secret-file "$WORK/secret" --run-dir "$WORK/run2" --steps 3 \
  "$WORK/one.pb" "$WORK/unresolved.txt" 2> "$WORK/err2"
rc=$?
[ "$rc" = 64 ] || fail "unresolvable host with ssh: exit $rc, expected 64: $(tail -3 "$WORK/err2")"
[ "$(grep -c . "$WORK/err2")" = 1 ] || fail "not one line: $(cat "$WORK/err2")"
grep -q "host no-such-host-$TAG.invalid does not resolve here.*give --bind ADDR" "$WORK/err2" \
  || fail "$(cat "$WORK/err2")"
echo "$NAME: $(cat "$WORK/err2")"
wait_for 3 no_tagged || fail "processes left behind: $(tagged)"
echo "$NAME: ok"
