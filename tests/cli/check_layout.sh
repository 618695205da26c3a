# scripts/check-layout: this checkout keeps the house rules (no source file
# over 600 lines; the launch code in folders by process, none including
# another process's folder except wire/); and the script sees each breach.
source "$(dirname "$0")/../lib/assert.sh"
CHECK="$OB_SOURCE_DIR/scripts/check-layout"

expect 0 '' -- "$CHECK" "$OB_SOURCE_DIR"
grep -qx 'layout ok' "$TMP/out" && pass || fail "check-layout on the checkout: $(cat "$TMP/out")"

# A small tree that keeps the rules, then one breach at a time.
tree() {
  rm -rf "$TMP/t"
  mkdir -p "$TMP/t/lib/ob/launch/"{master,agent,worker,wire} "$TMP/t/tools"
  printf '#include "ob/launch/wire/channel.h"\n#include "ob/launch/master/decision.h"\n' > "$TMP/t/lib/ob/launch/master/master.cc"
  printf '#include "ob/launch/wire/channel.h"\n' > "$TMP/t/lib/ob/launch/agent/agent.cc"
  printf '#include "ob/launch/worker/inputs.h"\n' > "$TMP/t/lib/ob/launch/worker/worker.cc"
  printf '#include "ob/launch/wire/store.h"\n' > "$TMP/t/lib/ob/launch/wire/channel.cc"
}
tree
expect 0 '' -- "$CHECK" "$TMP/t"

tree  # a worker reaching into the master's folder
printf '#include "ob/launch/master/decision.h"\n' >> "$TMP/t/lib/ob/launch/worker/worker.cc"
expect 1 '' -- "$CHECK" "$TMP/t"
grep -q 'lib/ob/launch/worker/worker.cc:2: includes lib/ob/launch/master/ from worker/' "$TMP/out" && pass || fail "worker->master: $(cat "$TMP/out")"

tree  # the wire reaching into a process's folder
printf '#include "ob/launch/agent/host.h"\n' >> "$TMP/t/lib/ob/launch/wire/channel.cc"
expect 1 '' -- "$CHECK" "$TMP/t"
grep -q 'includes lib/ob/launch/agent/ from wire/' "$TMP/out" && pass || fail "wire->agent: $(cat "$TMP/out")"

tree  # a file directly in lib/ob/launch/, and a folder that is no process's
touch "$TMP/t/lib/ob/launch/loose.cc"; mkdir "$TMP/t/lib/ob/launch/misc"
expect 1 '' -- "$CHECK" "$TMP/t"
grep -q 'loose.cc: directly in lib/ob/launch/' "$TMP/out" && pass || fail "loose file: $(cat "$TMP/out")"
grep -q 'misc/: not a process' "$TMP/out" && pass || fail "misc folder: $(cat "$TMP/out")"

tree  # a file of 601 lines under tools/
seq 601 > "$TMP/t/tools/long.cc"
expect 1 '' -- "$CHECK" "$TMP/t"
grep -q 'tools/long.cc: 601 lines, over 600' "$TMP/out" && pass || fail "long file: $(cat "$TMP/out")"
seq 600 > "$TMP/t/tools/long.cc"
expect 0 '' -- "$CHECK" "$TMP/t"

finish
