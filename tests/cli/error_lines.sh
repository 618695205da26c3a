# An error is one whole line even when many processes fail at once into
# one pipe, as every agent of a job does when the hosts lack something
# (process.launch_bad_input's "ob-launch-worker missing" once read
# "ob-launchob-launch: : /tmp/...": std::cerr had written each piece of the
# line apart). 40 at a time, three rounds, a usage error and an error of
# the run; every line must come out whole.
source "$(dirname "$0")/../lib/assert.sh"
L="$OB_BIN/ob-launch"

burst() {  # burst WANT CMD...: 40 concurrent CMDs, stderr into one pipe; prints the lines that are not WANT
  local want=$1 i
  shift
  for ((i = 0; i < 40; i++)); do "$@" 2>&1 >/dev/null & done 2>&1 | grep -vxF -- "$want"
  wait
}
usage="ob-launch: The following argument was not expected: --no-such-flag (try 'ob-launch --help')"
missing="ob-launch: $TMP/none.pb: cannot open: No such file or directory"
for round in 1 2 3; do
  bad=$(burst "$usage" "$L" --no-such-flag)
  [ -z "$bad" ] && pass || fail "usage errors, round $round: $(head -c 300 <<< "$bad")"
  bad=$(burst "$missing" "$L" --rsh local "$TMP/none.pb" "$TMP/none.txt")
  [ -z "$bad" ] && pass || fail "run errors, round $round: $(head -c 300 <<< "$bad")"
done
finish
