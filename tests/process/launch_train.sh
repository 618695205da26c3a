# ob-launch trains for real: 4 local hosts, gpt-tiny split into 2 pipelines
# of 2 stages (memory forces n0 = 2), 30 steps on README.md's bytes. The run
# exits 0, every rank reports every step, all ranks agree on the loss, the
# loss falls, and the closing line gives the final loss and throughput.
NAME=launch_train
source "$(dirname "$0")/../lib/launch.sh"
make_two_by_two

timeout 120 "$OB_BIN/ob-launch" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run" \
  --steps 30 --data "$OB_SOURCE_DIR/README.md" --metrics "$WORK/metrics.pb" \
  "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err" &
MASTER_PID=$!
wait "$MASTER_PID"; rc=$?; MASTER_PID=""
[ "$rc" = 0 ] || fail "ob-launch exited $rc: $(tail -5 "$WORK/err")"
grep -q "trained 30 steps: final loss [0-9.]*, [0-9]* tokens/s" "$WORK/err" || fail "no closing line: $(tail -3 "$WORK/err")"

python3 "$METRICS_PY" check "$WORK/metrics.pb" 30 4 > "$WORK/losses" || fail "metrics: $(cat "$WORK/losses")"
read -r _ first _ last < "$WORK/losses"
echo "$NAME: loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.8 * $first else 1)" || fail "the loss did not fall: $first -> $last"
[ -z "$(tagged)" ] || fail "processes left behind: $(tagged)"

# -q: only errors on stderr, from the master, its agents and their workers
# alike (the workers' start-up lines once came through).
timeout 60 "$OB_BIN/ob-launch" -q --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run-q" \
  --steps 3 "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err-q"
rc=$?
[ "$rc" = 0 ] || fail "-q: ob-launch exited $rc: $(tail -3 "$WORK/err-q")"
[ ! -s "$WORK/err-q" ] || fail "-q: $(wc -l < "$WORK/err-q") line(s) on stderr, as: $(head -2 "$WORK/err-q")"
[ -z "$(tagged)" ] || fail "processes left behind after -q: $(tagged)"
echo "$NAME: ok"
