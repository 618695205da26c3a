# An output that is one of the tool's inputs, by the same name, a symbolic
# link or a hard link, is refused before anything is opened (exit 64, one
# line naming both), and the input keeps its bytes: `ob-plan -o prof.pb
# prof.pb` replaced a measured profile with the plan, and `ob-launch
# --metrics corpus.txt --data corpus.txt` truncated the training set, both
# with exit 0. Two outputs that are one file are refused the same way.
source "$(dirname "$0")/../lib/assert.sh"
PROFILE="$OB_BIN/ob-profile"
PLAN="$OB_BIN/ob-plan"

"$PROFILE" --model gpt-tiny --analytic --gpu h100 -o "$TMP/prof.pb" || fail "profile"
printf 'h0 slots=1\nh1 slots=1\n' > "$TMP/hosts.txt"
"$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o "$TMP/plan.pb" "$TMP/prof.pb" || fail "plan"
"$OB_BIN/watch_synth" --steps 10 --seed 3 > "$TMP/run.pb" || fail "watch_synth"
head -c 20000 "$OB_SOURCE_DIR/README.md" > "$TMP/corpus.txt"
printf '0 fail h0\n' > "$TMP/trace.txt"
(umask 077; echo secret-for-the-tests > "$TMP/secret")
ln -s prof.pb "$TMP/link.pb"
ln "$TMP/prof.pb" "$TMP/hard.pb"
for f in prof.pb plan.pb hosts.txt run.pb corpus.txt trace.txt secret; do cp "$TMP/$f" "$TMP/$f.orig"; done

same_input='would destroy the input'
expect 64 "writing -o .*prof.pb $same_input .*prof.pb \(the profile\)" -- \
  "$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o "$TMP/prof.pb" "$TMP/prof.pb"
expect 64 "-o .*link.pb $same_input .*prof.pb \(the profile: the same file\)" -- \
  "$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o "$TMP/link.pb" "$TMP/prof.pb"
expect 64 "-o .*hard.pb $same_input .*prof.pb \(the profile: the same file\)" -- \
  "$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o "$TMP/hard.pb" "$TMP/prof.pb"
expect 64 "--schedule-svg .*hosts.txt $same_input .*\(--hosts\)" -- \
  "$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 --schedule-svg "$TMP/hosts.txt" "$TMP/prof.pb"
expect 64 "--log-file .*hosts.txt $same_input .*\(--hosts\)" -- \
  "$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o "$TMP/p2.pb" --log-file "$TMP/hosts.txt" "$TMP/prof.pb"
expect 64 "-o .*plan.pb $same_input .*\(the profile\)" -- "$PLAN" --explain -o "$TMP/plan.pb" "$TMP/plan.pb"
# Two outputs, neither there yet: one file by name.
expect 64 "--schedule-svg .*new.pb and -o .*new.pb are one file" -- \
  "$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o "$TMP/new.pb" --schedule-svg "$TMP/./new.pb" "$TMP/prof.pb"
[ ! -e "$TMP/new.pb" ] && pass || fail "the refused plan wrote new.pb"

expect 64 "-o .*prof.pb $same_input .*\(the profile\)" -- "$PROFILE" --table -o "$TMP/prof.pb" "$TMP/prof.pb"
expect 64 "--svg .*trace.txt $same_input .*\(--trace\)" -- \
  "$OB_BIN/ob-sim" --trace "$TMP/trace.txt" --svg "$TMP/trace.txt" "$TMP/plan.pb"
expect 64 "-o .*plan.pb $same_input .*\(the plan\)" -- "$OB_BIN/ob-sim" --node-mtbf 10d -o "$TMP/plan.pb" "$TMP/plan.pb"
expect 64 "--plot .*run.pb $same_input .*\(the metrics\)" -- "$OB_BIN/ob-watch" --plot "$TMP/run.pb" "$TMP/run.pb"

# ob-data: checked before the vocabulary is read, so these need none.
V=(--vocab "$TMP/none.json" --merges "$TMP/none.bpe")
cp "$TMP/corpus.txt" "$TMP/corpus.bin"
expect 64 "-o .*corpus.bin $same_input .*corpus.bin \(an input\)" -- \
  "$OB_BIN/ob-data" tokenize "${V[@]}" -o "$TMP/corpus.bin" "$TMP/corpus.bin"
expect 64 "--val-output .*t.bin and -o .*t.bin are one file" -- \
  "$OB_BIN/ob-data" tokenize "${V[@]}" --val-fraction 0.1 --val-output "$TMP/t.bin" -o "$TMP/t.bin" "$TMP/corpus.txt"
expect 64 "-o .*corpus.bin $same_input" -- "$OB_BIN/ob-data" decode "${V[@]}" -o "$TMP/corpus.bin" "$TMP/corpus.bin"
cmp -s "$TMP/corpus.bin" "$TMP/corpus.txt" && pass || fail "ob-data changed its input"

# ob-launch refuses before it starts anything.
L=("$OB_BIN/ob-launch" --rsh local --secret-file "$TMP/secret" --steps 2 --run-dir "$TMP/run")
expect 64 "--metrics .*corpus.txt $same_input .*\(--data\)" -- \
  "${L[@]}" --data "$TMP/corpus.txt" --metrics "$TMP/corpus.txt" "$TMP/plan.pb" "$TMP/hosts.txt"
expect 64 "--metrics .*corpus.txt $same_input .*\(--eval-data\)" -- \
  "${L[@]}" --eval-data "$TMP/corpus.txt" --metrics "$TMP/corpus.txt" "$TMP/plan.pb" "$TMP/hosts.txt"
expect 64 "--metrics .*plan.pb $same_input .*\(the plan\)" -- \
  "${L[@]}" --metrics "$TMP/plan.pb" "$TMP/plan.pb" "$TMP/hosts.txt"
expect 64 "--log-file .*secret $same_input .*\(--secret-file\)" -- \
  "${L[@]}" --log-file "$TMP/secret" "$TMP/plan.pb" "$TMP/hosts.txt"
[ ! -e "$TMP/run" ] && pass || fail "a refused ob-launch made its run directory"

for f in prof.pb plan.pb hosts.txt run.pb corpus.txt trace.txt secret; do
  cmp -s "$TMP/$f" "$TMP/$f.orig" && pass || fail "$f was changed by a refused command"
done
[ -L "$TMP/link.pb" ] && pass || fail "the link was replaced"

# Devices and pipes are written through, never replaced: reading and
# writing one is no loss, and stays allowed.
"$PLAN" --hosts "$TMP/hosts.txt" -f 0 -B 8 -o /dev/stdout "$TMP/prof.pb" > "$TMP/to-stdout.pb" \
  && [ -s "$TMP/to-stdout.pb" ] && pass || fail "-o /dev/stdout was refused"
# Standard input is one stream: two inputs that are both '-' (or one left
# to default to it) are refused before either is read. ob-plan read the
# hosts file as its profile: "<stdin>: not a valid ob Profile".
expect 64 "the profile and --hosts are both '-', standard input, which only one can read" -- \
  "$PLAN" --hosts - -f 0 -B 8 -o "$TMP/p-stdin.pb" < "$TMP/hosts.txt"
expect 64 "the plan and --trace are both '-'" -- "$OB_BIN/ob-sim" --trace - - < "$TMP/trace.txt"
"$PLAN" --hosts - -f 0 -B 8 -o "$TMP/p-stdin.pb" "$TMP/prof.pb" < "$TMP/hosts.txt" \
  && cmp -s <("$PLAN" --explain "$TMP/p-stdin.pb") <("$PLAN" --explain "$TMP/plan.pb") \
  && pass || fail "--hosts - made another plan than the hosts file"
finish
