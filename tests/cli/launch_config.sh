# ob-launch --config FILE and --print-config (ob-launch(1), CONFIGURATION
# FILE): the options in effect printed as YAML read back to the same text,
# command-line options win over the file's (a list replacing the file's
# list); a bad key, a bad type and a bad value are each one line naming the
# file, the line and the key, exit 78, before anything starts; a file that
# cannot be read exits 66.
source "$(dirname "$0")/../lib/assert.sh"
L="$OB_BIN/ob-launch"
cd "$TMP" || exit 1

# 1. The round trip, with values of every kind given on the command line.
expect 0 '' -- "$L" --print-config --steps 7 --lr 3e-4 --inject 0:hang=5 --inject '1:slow=2@2' \
  --rsh 'ip netns exec {host}' --resume-from-other -v --eval-every 5 plan.pb
cp "$TMP/out" a.yaml
for line in 'plan: plan.pb' 'steps: 7' '  lr: 3e-4' '  - 0:hang=5' '  - 1:slow=2@2' 'resume-from-other: true' \
  'verbose: 1' '  every: 5' 'data: synthetic' 'hosts: ~' '  eps: 1e-08'; do
  grep -qxF -- "$line" a.yaml && pass || fail "--print-config lacks '$line': $(cat a.yaml)"
done
[ "$(grep -c '^rsh: ' a.yaml)" = 1 ] && pass || fail "rsh: $(grep rsh a.yaml)"
expect 0 '' -- "$L" --config a.yaml --print-config
cp "$TMP/out" b.yaml
cmp -s a.yaml b.yaml && pass || fail "--config a.yaml --print-config differs: $(diff a.yaml b.yaml)"

# The command line wins, and its --inject replaces the file's list.
expect 0 '' -- "$L" --config a.yaml --steps 9 --inject 2:nan=4 --print-config
cp "$TMP/out" c.yaml
diff a.yaml c.yaml | grep '^[<>]' > c.diff
printf '%s\n' '< steps: 7' '< - 0:hang=5' '< - 1:slow=2@2' '> steps: 9' '> - 2:nan=4' > c.want
sed 's/^\([<>]\) *\(.*\)/\1 \2/' c.diff | sort > c.got
sort c.want | cmp -s - c.got && pass || fail "overrides: $(cat c.diff)"

# The quick start's file: its keys, as it says them, and its own round trip.
Q="$OB_SOURCE_DIR/examples/quickstart.yaml"
expect 0 '' -- "$L" --config "$Q" --print-config
cp "$TMP/out" q.yaml
for line in 'plan: plan.pb' 'hosts: hosts.txt' 'rsh: local' 'secret-file: secret' 'steps: 200' \
  'data: ../README.md' 'run-dir: run' 'metrics: run.metrics'; do
  grep -qxF -- "$line" q.yaml && pass || fail "quickstart.yaml: --print-config lacks '$line'"
done
expect 0 '' -- "$L" --config q.yaml --print-config
cmp -s q.yaml "$TMP/out" && pass || fail "quickstart.yaml's round trip differs: $(diff q.yaml "$TMP/out")"

# contrib/ob-train.sbatch's file is one ob-launch reads.
expect 0 '' -- "$L" --config "$OB_SOURCE_DIR/contrib/ob-train.yaml" --print-config
for line in 'steps: 100000' 'data: /shared/ob/data/train.bin' '  data: /shared/ob/data/val.bin' '  every: 500' \
  '  dir: /shared/ob/ckpt' '  every: 200' 'secret-file: /shared/ob/secret'; do
  grep -qxF -- "$line" "$TMP/out" && pass || fail "ob-train.yaml: --print-config lacks '$line'"
done

# 2. Mistakes, each in a file that would otherwise start a run here.
"$OB_BIN/ob-profile" --model gpt-tiny --analytic --gpu h100 --dtype float32 --seq-len 32 -q -o tiny.pb \
  || fail "ob-profile"
printf 'a\nb\n' > hosts.txt
"$OB_BIN/ob-plan" --hosts hosts.txt -g 1 -f 0 -B 4 -q -o plan.pb tiny.pb || fail "ob-plan"
(umask 077; echo "secret-$$-for-the-tests" > secret)
# bad NAME EXIT PATTERN LINES...: a file of the good lines, then LINES;
# ob-launch --config on it exits EXIT with one line matching PATTERN, and
# makes no run directory.
bad() {
  local name=$1 rc=$2 pattern=$3
  shift 3
  printf '%s\n' 'plan: plan.pb' 'hosts: hosts.txt' 'rsh: local' 'secret-file: secret' "run-dir: run-$name" \
    "$@" > "$name.yaml"
  expect "$rc" "$pattern" -- "$L" --config "$name.yaml"
  [ ! -e "run-$name" ] && pass || fail "$name: a run directory was made"
}
bad key 78 "^ob-launch: key\.yaml:7: unknown key 'stpes' \(did you mean 'steps'\?\)$" 'steps: 3' 'stpes: 3'
bad nested 78 "^ob-launch: nested\.yaml:7: unknown key 'eval\.evry' \(did you mean 'eval\.every'\?\)$" \
  'eval:' '  evry: 3'
bad hidden 78 "^ob-launch: hidden\.yaml:6: unknown key 'rank' " 'rank: 0'
bad type 78 "^ob-launch: type\.yaml:6: steps: 'abc' is not an integer$" 'steps: abc'
bad list 78 "^ob-launch: list\.yaml:6: steps: expected an integer, not a list$" 'steps: [1, 2]'
bad flag 78 "^ob-launch: flag\.yaml:6: resume-from-other: 'yes' is not true or false$" 'resume-from-other: yes'
bad value 78 "^ob-launch: value\.yaml:7: steps: '-3' must not be negative$" 'seed: 1' 'steps: -3'
bad member 78 "^ob-launch: member\.yaml:6: device: gpu not in \{auto,cpu,cuda\}$" 'device: gpu'
bad section 78 "^ob-launch: section\.yaml:6: optimizer: expected a mapping" 'optimizer: 3'
bad twice 78 "^ob-launch: twice\.yaml:7: steps is given twice \(line 6 too\)$" 'steps: 3' 'steps: 4'
# A list never closed: yaml-cpp finds so at the end of the file, line 7.
bad syntax 78 "^ob-launch: syntax\.yaml:7: [a-z]" 'inject: [0:hang=5'
# A check across options, made after reading them all, points into the file too.
bad across 78 "^ob-launch: across\.yaml:8: --min-lr 0\.5: must be between 0 and --lr$" \
  'optimizer:' '  lr: 0.1' '  min-lr: 0.5'
# A bad type is refused even where the command line overrides the key.
printf 'steps: many\n' > over.yaml
expect 78 "^ob-launch: over\.yaml:1: steps: 'many' is not an integer$" -- "$L" --config over.yaml --steps 3 --print-config
# The same value on the command line stays a usage error.
expect 64 "^ob-launch: --steps: '-3' must not be negative" -- "$L" --steps -3 --print-config
expect 66 "^ob-launch: missing\.yaml: cannot open: No such file or directory$" -- "$L" --config missing.yaml
# The file is an input: --metrics over it is refused before it is touched.
printf 'steps: 3\n' > keep.yaml
expect 64 "would destroy the input keep\.yaml \(--config\)" -- "$L" --config keep.yaml --metrics keep.yaml plan.pb
[ "$(cat keep.yaml)" = 'steps: 3' ] && pass || fail "keep.yaml was changed"
finish
