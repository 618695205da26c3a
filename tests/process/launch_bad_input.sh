#!/usr/bin/env bash
# Bad hosts files, plans, secrets and options are refused before anything
# starts: one clear line and the documented exit status.
NAME=launch_bad_input
source "$(dirname "$0")/../lib/launch.sh"
source "$(dirname "$0")/../lib/assert.sh"
trap 'cleanup; rm -rf "$TMP"' EXIT   # assert.sh's trap replaced ours
unset OB_SECRET
make_cluster 2
L="$OB_BIN/ob-launch"
export OB_TEST_WORKER_CMD="true; : $TAG"
run() { "$L" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run" "$@"; }

printf '%sh1\n%sh2\n%sh1\n' "$TAG" "$TAG" "$TAG" > "$WORK/dup.txt"
expect 78 "dup.txt:3: duplicate host '${TAG}h1'" -- run "$WORK/plan.pb" "$WORK/dup.txt"
printf '%sh1\n%sh2;rm\n' "$TAG" "$TAG" > "$WORK/meta.txt"
expect 78 'meta.txt:2: .*host' -- run "$WORK/plan.pb" "$WORK/meta.txt"
printf '%sh1\n%sh2 colour=red\n' "$TAG" "$TAG" > "$WORK/key.txt"
expect 78 'key.txt:2: .*colour' -- run "$WORK/plan.pb" "$WORK/key.txt"
printf '%sh1\nother\n' "$TAG" > "$WORK/missing.txt"
expect 78 "plan host '${TAG}h2' is not in" -- run "$WORK/plan.pb" "$WORK/missing.txt"
expect 64 'no-such-option' -- "$L" --no-such-option "$WORK/plan.pb" "$WORK/hosts.txt"
expect 66 'nothere.pb' -- run "$WORK/nothere.pb" "$WORK/hosts.txt"
echo garbage > "$WORK/bad.pb"
expect 65 'bad.pb' -- run "$WORK/bad.pb" "$WORK/hosts.txt"
expect 64 'bind' -- run --bind 1.2.3.4:99999 "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 "--bind: 'not-an-ip' is not an IP address" -- run --bind not-an-ip "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 "--bind: '999.1.1.1' is not an IP address" -- run --bind 999.1.1.1 "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 "--standby: maybe not in .on,exec,off." -- run --standby maybe "$WORK/plan.pb" "$WORK/hosts.txt"
# Flags are judged before any file is read: a missing plan does not hide them.
for v in 70000 0 -1 9x ''; do
  expect 64 "--probe-port: '$v' is not a port .1-65535. or 'off'" -- run --probe-port "$v" "$WORK/nothere.pb" "$WORK/hosts.txt"
done
# TEST-NET-1: never an address of this machine.
expect 78 '--bind 192.0.2.1: not an address of this machine' -- run --bind 192.0.2.1 "$WORK/plan.pb" "$WORK/hosts.txt"
# Permanent mistakes in the training flags: at once, before any host starts.
t0=$(now_ms)
expect 66 '/nonexistent/data.bin: No such file' -- run --data /nonexistent/data.bin "$WORK/plan.pb" "$WORK/hosts.txt"
[ $(( $(now_ms) - t0 )) -lt 5000 ] || fail "--data /nonexistent took $(( $(now_ms) - t0 )) ms"
# A text file is read as bytes: legal for any model, and said when the
# model's vocabulary is larger than a byte's (GPT-2 trained on byte ids).
printf 'name: gpt-tiny-512\nn_layer: 2\nn_embd: 64\nn_head: 4\nn_positions: 64\nvocab_size: 512\n' > "$WORK/v512.yaml"
"$OB_BIN/ob-profile" --model "$WORK/v512.yaml" --analytic --gpu h100 --dtype float32 --seq-len 64 -q -o "$WORK/v512.pb" \
  && "$OB_BIN/ob-plan" --hosts "$WORK/hosts.txt" -g 1 -f 1 -B 8 -o "$WORK/v512-plan.pb" "$WORK/v512.pb" \
  || fail "the vocabulary-512 plan"
bytes_run() { "$L" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/run-bytes-$1" --steps 1 \
  --data "$OB_SOURCE_DIR/README.md" "$2" "$WORK/hosts.txt"; }
expect 0 "README.md: not a token file, so read as bytes \(ids 0-255\), while the plan's model has a vocabulary of 512" -- \
  bytes_run 512 "$WORK/v512-plan.pb"
expect 0 "" -- bytes_run 256 "$WORK/plan.pb"
# The plan piped in: it was read once for each check and found empty by
# the second ("<stdin>: empty file, expected an ob Plan", exit 65), so
# ob-plan ... | ob-launch - hosts.txt and <(ob-plan ...) never ran.
expect 0 "" -- bytes_run stdin - < "$WORK/plan.pb"
expect 0 "" -- bytes_run fifo <(cat "$WORK/plan.pb")
expect 64 "the plan and the hosts file are both '-', standard input, which only one can read" -- \
  run - - < "$WORK/plan.pb"
! grep -q "read as bytes" "$TMP/err" || fail "gpt-tiny (256 ids) was warned about bytes: $(grep "read as bytes" "$TMP/err")"
expect 64 '--lr -1.*positive' -- run --lr -1 "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 '--lr nan.*positive' -- run --lr nan "$WORK/plan.pb" "$WORK/hosts.txt"
# inf is no negative number: the line said "must not be negative" for it.
expect 64 '--weight-decay inf: must be a finite number, 0 or more' -- run --weight-decay inf "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 '--clip-norm inf: must be a finite number, 0 or more' -- run --clip-norm inf "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 'steps.*must not be negative' -- run --steps -3 "$WORK/plan.pb" "$WORK/hosts.txt"
expect 64 '--warmup-steps 10 is longer than --steps 3: the learning rate would never reach --lr' -- \
  run --steps 3 --warmup-steps 10 "$WORK/plan.pb" "$WORK/hosts.txt"
# One directory for the run and the checkpoints: each is locked by its own
# owner, and the second lock read "in use by another process" (exit 78),
# the process being this one.
rm -rf "$WORK/run"
expect 64 "--ckpt-dir .*run/ is the run directory \(--run-dir .*run\): give the checkpoints a directory of their own" -- \
  run --ckpt-dir "$WORK/run/" "$WORK/plan.pb" "$WORK/hosts.txt"
[ ! -e "$WORK/run" ] && pass || fail "the refused run made its run directory"
mkdir -p "$WORK/run" && ln -s run "$WORK/run-link"
expect 64 "--ckpt-dir .*run-link is the run directory" -- run --ckpt-dir "$WORK/run-link" "$WORK/plan.pb" "$WORK/hosts.txt"
rm -rf "$WORK/run" "$WORK/run-link"
# Timeouts that never fire (NaN) or fire at once (inf, and 1e300 s, whose
# milliseconds overflowed: "no agent authenticated within inf s").
for o in --agent-timeout --master-timeout --start-timeout --hang-timeout --stop-grace; do
  for v in 0 -1 inf nan; do
    expect 64 "$o: '$v' (must be a positive number of seconds|is not a finite number)" -- \
      run "$o" "$v" "$WORK/plan.pb" "$WORK/hosts.txt"
  done
  expect 64 "$o: '1e300' must be a positive number of seconds, at most 1000000" -- \
    run "$o" 1e300 "$WORK/plan.pb" "$WORK/hosts.txt"
done
expect 64 'steps 0 evaluates a checkpoint: give --resume' -- run --steps 0 "$WORK/plan.pb" "$WORK/hosts.txt"
! grep -qs agent-start "$WORK/run/events.log" || fail "hosts were started for a bad flag: $(cat "$WORK/run/events.log")"
# Data the master cannot see is the hosts' to check (an rsh that is not
# 'local': here env(1), on this machine): the first worker that finds it
# missing exits 66, and the run stops with 66 at once, restarting nothing.
t0=$(now_ms)
OB_TEST_WORKER_CMD= "$L" --rsh "env OB_FAKE_SSH={host}" --secret-file "$WORK/secret" --run-dir "$WORK/run66" \
  --data /nonexistent/data.bin "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err66"
rc=$?
# (The master's last line: an agent's own may come after it.)
[ "$rc" = 66 ] && grep "^ob-launch: " "$WORK/err66" | tail -1 \
  | grep -q "exit status 66: /nonexistent/data.bin: cannot read: No such file or directory; not restarting" \
  && pass || fail "data missing on the hosts: exit $rc: $(tail -4 "$WORK/err66")"
[ $(( $(now_ms) - t0 )) -lt 10000 ] || fail "data missing on the hosts: took $(( $(now_ms) - t0 )) ms"
! grep -q "start-workers generation=2" "$WORK/run66/events.log" || fail "workers were restarted for missing data"

# Secrets: none, empty, readable by others.
# A run directory another user owns, or every user may write: its logs
# and control socket could be links planted there (a master run as root
# appended its events to whatever events.log pointed at).
mkdir -p "$WORK/open-run" && chmod 0777 "$WORK/open-run"
expect 78 "open-run: the run directory \(--run-dir\) is writable by every user \(mode 0777\)" -- \
  "$L" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/open-run" "$WORK/plan.pb" "$WORK/hosts.txt"
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$WORK/their-run" && chown 12345 "$WORK/their-run"
  expect 78 "their-run: the run directory \(--run-dir\) is owned by uid 12345, not 0" -- \
    "$L" --rsh local --secret-file "$WORK/secret" --run-dir "$WORK/their-run" "$WORK/plan.pb" "$WORK/hosts.txt"
fi
expect 78 'no shared secret' -- "$L" --rsh local --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt"
: > "$WORK/empty"; chmod 600 "$WORK/empty"
expect 78 'empty' -- "$L" --rsh local --secret-file "$WORK/empty" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt"
cp "$WORK/secret" "$WORK/open"; chmod 644 "$WORK/open"
expect 78 'chmod 600' -- "$L" --rsh local --secret-file "$WORK/open" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt"
expect 78 'nosuch' -- "$L" --rsh local --secret-file "$WORK/nosuch" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt"

# Agents that cannot start: 69 naming the host.
"$L" --rsh /nonexistent/rsh --secret-file "$WORK/secret" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err"
rc=$?; [ "$rc" = 69 ] && grep -q "host ${TAG}h1: cannot run '/nonexistent/rsh'" "$WORK/err" && pass \
  || fail "--rsh missing: exit $rc: $(cat "$WORK/err")"
"$L" --rsh false --secret-file "$WORK/secret" --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err"
# Every host that failed is named, not only the first to give up (ssh to
# unreachable hosts: each one's ConnectTimeout).
rc=$?; [ "$rc" = 69 ] && tail -1 "$WORK/err" | grep -Eq "^ob-launch: the agents on 2 hosts exited before they connected: ${TAG}h[12], ${TAG}h[12] \(exit status 1\)$" \
  && [ "$(tail -1 "$WORK/err" | grep -o "${TAG}h[12]" | sort -u | wc -l)" = 2 ] && pass \
  || fail "--rsh false: exit $rc: $(cat "$WORK/err")"

# ob-launch missing on the hosts (an rsh that runs on this machine and keeps
# the host name out of the command): 69, every host named, and the hint.
"$L" --rsh "env OB_RSH_HOST={host}" --agent-exe /nonexistent/ob-launch --secret-file "$WORK/secret" \
  --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err"
rc=$?; [ "$rc" = 69 ] && tail -1 "$WORK/err" | grep -q "^ob-launch: the agents on 2 hosts exited before they connected: .*(exit status 127: no /nonexistent/ob-launch there; see --agent-exe)" \
  && pass || fail "--agent-exe missing: exit $rc: $(cat "$WORK/err")"

# ob-launch without ob-launch-worker beside it on the hosts: each agent
# says so, naming the path, and exits 78; the master names every host.
mkdir -p "$WORK/alone" && cp "$L" "$WORK/alone/ob-launch"
"$L" --rsh "env OB_RSH_HOST={host}" --agent-exe "$WORK/alone/ob-launch" --secret-file "$WORK/secret" \
  --run-dir "$WORK/run" "$WORK/plan.pb" "$WORK/hosts.txt" 2> "$WORK/err"
rc=$?; [ "$rc" = 69 ] && tail -1 "$WORK/err" | grep -Eq "^ob-launch: the agents on 2 hosts exited before they connected: ${TAG}h[12], ${TAG}h[12] \(exit status 78\)$" \
  && [ "$(grep -c "$WORK/alone/ob-launch-worker: No such file or directory (ob-launch runs its workers with ob-launch-worker, installed beside it on every host)" "$WORK/err")" = 2 ] \
  && pass || fail "ob-launch-worker missing: exit $rc: $(cat "$WORK/err")"

# Forty hosts whose agents cannot start, two of them for another reason:
# one closing line a person can read, the hosts grouped by what their exits
# said, a few named and the rest counted, and a line each on stderr for the
# first few only (events.log names every one).
mkdir -p "$WORK/many"
for ((i = 1; i <= 40; i++)); do echo "${TAG}m$i"; done > "$WORK/many/hosts.txt"
"$OB_BIN/ob-plan" --hosts "$WORK/many/hosts.txt" -g 1 -f 1 -B 8 -o "$WORK/many/plan.pb" \
  "$WORK/cluster-profile.pb" 2> /dev/null || fail "ob-plan for 40 hosts"
printf '#!/bin/sh\ncase $1 in *m5|*m17) exit 255 ;; esac\nexit 3\n' > "$WORK/many/rsh"
chmod +x "$WORK/many/rsh"
"$L" --rsh "$WORK/many/rsh" --secret-file "$WORK/secret" --run-dir "$WORK/many/run" "$WORK/many/plan.pb" \
  "$WORK/many/hosts.txt" 2> "$WORK/err"
rc=$?
last=$(tail -1 "$WORK/err")
[ "$rc" = 69 ] && [[ "$last" == "ob-launch: the agents on 40 hosts exited before they connected: "* ]] \
  && grep -Eq "(: |; )([^ ;]+, ){7}[^ ;]+ and 30 more \(exit status 3\)" <<< "$last" \
  && grep -Eq "(: |; )${TAG}m(5|17), ${TAG}m(5|17) \(exit status 255\)" <<< "$last" \
  && [ "${#last}" -lt 600 ] \
  && [ "$(grep -c "exited before it connected" "$WORK/err")" -le 8 ] \
  && [ "$(grep -c " detect the agent on host ${TAG}m[0-9]* exited before it connected" "$WORK/many/run/events.log")" = 40 ] \
  && pass || fail "40 hosts that cannot start: exit $rc, ${#last} characters: $last"

wait_for 2 no_tagged || fail "processes left: $(tagged | xargs -r ps -o pid,args -p)"
finish
