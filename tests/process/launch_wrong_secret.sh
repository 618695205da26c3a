#!/usr/bin/env bash
# An agent started by hand with a wrong secret is rejected, and the master's
# log says so with the agent's address; one that knows the secret but names
# a host outside the plan is rejected too. The real run is not disturbed.
NAME=launch_wrong_secret
source "$(dirname "$0")/../lib/launch.sh"
make_cluster 2

OB_TEST_WORKER_CMD="exec sleep 2" timeout 30 "$OB_BIN/ob-launch" --rsh local \
  --secret-file "$WORK/secret" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt" \
  2> "$WORK/err" &
MASTER_PID=$!
listening() { grep -q ' listen ' "$WORK/run/events.log" 2>/dev/null; }
wait_for 10 listening || fail "master did not listen: $(tail -3 "$WORK/err")"
addr=$(grep ' listen ' "$WORK/run/events.log" | head -1 | awk '{print $4}')

echo "not-the-secret" > "$WORK/wrong"
timeout 10 "$OB_BIN/ob-launch" --agent --master "$addr" --host "${TAG}h1" < "$WORK/wrong" 2> "$WORK/agent_err"
rc=$?
[ "$rc" = 78 ] || fail "wrong-secret agent: exit $rc, expected 78: $(cat "$WORK/agent_err")"
grep -q "secret" "$WORK/agent_err" || fail "the agent does not say why: $(cat "$WORK/agent_err")"

timeout 10 "$OB_BIN/ob-launch" --agent --master "$addr" --host "${TAG}stranger" < "$WORK/secret" 2> "$WORK/agent_err2"
rc=$?
[ "$rc" = 78 ] || fail "unknown-host agent: exit $rc, expected 78: $(cat "$WORK/agent_err2")"

wait "$MASTER_PID"; rc=$?
MASTER_PID=""
[ "$rc" = 0 ] || fail "master: exit $rc, expected 0: $(tail -3 "$WORK/err")"
grep -Eq "rejected agent connection from 127\.0\.0\.1:[0-9]+: authentication failed for host '${TAG}h1' \(wrong secret" \
  "$WORK/run/master.log" || fail "master.log does not record the rejection: $(grep rejected "$WORK/run/master.log")"
grep -Eq "rejected agent connection from 127\.0\.0\.1:[0-9]+: unknown host '${TAG}stranger'" \
  "$WORK/run/master.log" || fail "master.log does not record the unknown host"
grep -q "secret-$TAG" "$WORK/run/master.log" "$WORK/err" "$WORK/run/events.log" && fail "the secret leaked into a log"
wait_for 2 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
echo "launch_wrong_secret: ok"
