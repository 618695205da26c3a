# The standby master's process tests (tests/process/launch_standby_*.sh):
# gpt-tiny's two pipelines of two stages on four hosts in network
# namespaces, the master inside the first host's, its standby on the
# second. Source after tests/lib/launch.sh and tests/lib/netns.sh, once
# netns_require has passed and the EXIT trap runs cleanup and
# netns_cleanup.

# standby_hosts STEPS: the plan, an uninterrupted run of STEPS steps
# ($WORK/ref.pb), the namespaces on a star and the rsh ($WORK/rsh). Sets
# hosts, master_host and standby_host.
standby_hosts() {
  make_two_by_two
  reference_run "$1"
  mapfile -t hosts < "$WORK/hosts.txt"
  master_host=${hosts[0]}
  standby_host=${hosts[1]}
  netns_add "${hosts[@]}"
  netns_star_ready "${hosts[@]}"
  netns_rsh "$WORK/rsh"
}

# standby_start RUN STEPS CUT_STEP: the master in the first host's
# namespace (run directory $WORK/RUN, metrics $WORK/RUN.pb, stderr
# $WORK/RUN.err), its standby on the second, until the standby follows
# (60 s at most) and a rank has reached CUT_STEP (120 s at most). Sets
# MASTER_PID, events and standby_events.
standby_start() {
  local run=$1 steps=$2 cut_step=$3
  ip netns exec "$master_host" "$OB_BIN/ob-launch" --rsh "$WORK/rsh" --bind "${NETNS_ADDR[$master_host]}" \
    --master-host "$master_host" --standby-master "$standby_host" --secret-file "$WORK/secret" \
    --run-dir "$WORK/$run" --steps "$steps" --data "$OB_SOURCE_DIR/tests/data/corpus.txt" \
    --metrics "$WORK/$run.pb" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/$run.err" &
  MASTER_PID=$!
  events="$WORK/$run/events.log"
  standby_events="$WORK/$run/standby-$standby_host/events.log"
  _following() { grep -q " standby-master host=$standby_host address=" "$events" 2>/dev/null || master_done; }
  wait_for 60 _following || fail "$run: no standby master followed in 60 s: $(tail -3 "$WORK/$run.err")"
  _at_cut() { [ "$(max_step "$WORK/$run.pb")" -ge "$1" ] || master_done; }
  wait_for 120 _at_cut "$cut_step" || fail "$run: no step $cut_step in 120 s: $(tail -3 "$WORK/$run.err")"
  master_done && fail "$run: the master exited before step $cut_step: $(tail -5 "$WORK/$run.err")"
}

# master_done: the master started last has exited.
master_done() { ! kill -0 "$MASTER_PID" 2>/dev/null; }

# standby_empty: no process left in the hosts' namespaces, none tagged.
standby_empty() {
  local h
  for h in "${hosts[@]}"; do [ -z "$(ip netns pids "$h" 2>/dev/null)" ] || return 1; done
  no_tagged
}
