#!/usr/bin/env bash
# The end of a run is not a hang (issue 54). 12 and then 16 local hosts of
# one slot, gpt-tiny in 2-stage pipelines (f = n/2 - 1: n/2 of them), 30 steps: on two cores
# the workers take seconds from their last step to their exit (the last
# records, the groups torn down, the process's own exit), longer than the
# 3 s hang timeout, and a master that judged that time as a step declared
# every rank hung after the last step, restarted them all, and exited 75
# ("3 recoveries in a row completed no step") with every step trained. Each
# run must exit 0 in generation 1 with every rank's 30 steps, and no
# detection of any kind.
NAME=launch_end_of_run
source "$(dirname "$0")/../lib/launch.sh"
command -v python3 >/dev/null || skip "no python3"
STEPS=30

for n in ${LAUNCH_END_HOSTS:-12 16}; do
  make_pipelines "$n" $((n / 2 - 1))
  run_start "n$n" "$STEPS"
  run_wait
  [ "$RC" = 0 ] || fail "$n hosts: exit $RC, expected 0: $(grep -E 'detect|decide|done' "$WORK/n$n/events.log" | head -5)"
  python3 "$METRICS_PY" check "$WORK/n$n.pb" "$STEPS" "$n" > /dev/null \
    || fail "$n hosts: not every rank's $STEPS steps in the metrics"
  ! grep -E ' (detect|worker-hang|worker-exit .*killed|decide) ' "$WORK/n$n/events.log" \
    || fail "$n hosts: a detection in a run where nothing failed (above)"
  [ "$(grep -c ' start-workers ' "$WORK/n$n/events.log")" = 1 ] \
    || fail "$n hosts: more than one generation: $(grep ' start-workers ' "$WORK/n$n/events.log")"
  wait_for 5 no_tagged || fail "$n hosts: processes left behind: $(tagged)"
  echo "$NAME: $n hosts: $STEPS steps, exit 0, one generation, no detection"
done
