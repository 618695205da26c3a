# Every tool's output path (-o, --schedule-svg, --plot, ob-ckpt export -o)
# writes through what is not a regular file — a device node, a FIFO, a
# descriptor path, `>(cmd)` — and never replaces it with a regular file; a
# symbolic link stays a link and its target gets the bytes.
source "$(dirname "$0")/../lib/assert.sh"
PROFILE="$OB_BIN/ob-profile"
PLAN="$OB_BIN/ob-plan"
WATCH="$OB_BIN/ob-watch"
CKPT="$OB_BIN/ob-ckpt"

"$PROFILE" --model gpt-tiny --analytic --gpu h100 -o "$TMP/tiny.pb" || fail "profile"
"$OB_BIN/watch_synth" --steps 40 --seed 3 > "$TMP/run.pb" || fail "watch_synth"
"$OB_BIN/ckpt_writer" --dir "$TMP/ck" --layers 3 --writers 1 --steps 1 --rows 4 --cols 4 > /dev/null \
  || fail "ckpt_writer"

# One command per output flag; "$1" is the output path.
write_with() {  # KIND PATH
  case $1 in
    profile) "$PROFILE" --model gpt-tiny --analytic --gpu h100 -o "$2" ;;
    plan) "$PLAN" --nodes 2 -f 0 -B 8 -o "$2" "$TMP/tiny.pb" ;;
    svg) "$PLAN" --nodes 2 -f 0 -B 8 --schedule-svg "$2" "$TMP/tiny.pb" > /dev/null ;;
    plot) "$WATCH" --plot "$2" "$TMP/run.pb" > /dev/null ;;
    export) "$CKPT" export "$TMP/ck" -o "$2" ;;
  esac
}
# The bytes each command writes to a regular file, to compare with.
for k in profile plan svg plot export; do
  write_with $k "$TMP/ref.$k" 2>"$TMP/err.$k" || [ $k = plot ] || fail "$k to a file: $(cat "$TMP/err.$k")"
  [ -s "$TMP/ref.$k" ] || fail "$k wrote nothing to a regular file"
done

for k in profile plan svg plot export; do
  # A FIFO: the reader gets every byte, and it is still a FIFO.
  mkfifo "$TMP/fifo"
  timeout 10 cat "$TMP/fifo" > "$TMP/got" &
  reader=$!
  write_with $k "$TMP/fifo" 2>"$TMP/err"
  wait $reader
  [ -p "$TMP/fifo" ] && pass || fail "$k: the FIFO was replaced ($(stat -c %F "$TMP/fifo"))"
  [ "$(wc -c < "$TMP/got")" -gt 0 ] && pass || fail "$k: nothing came through the FIFO: $(cat "$TMP/err")"
  rm -f "$TMP/fifo" "$TMP/got"

  # Process substitution, /dev/fd/N.
  write_with $k >(cat > "$TMP/sub") 2>"$TMP/err"
  for _ in $(seq 50); do [ -s "$TMP/sub" ] && break; sleep 0.1; done
  [ -s "$TMP/sub" ] && pass || fail "$k -o >(cmd): nothing arrived: $(cat "$TMP/err")"
  rm -f "$TMP/sub"

  # A symbolic link (relative, in another directory): still a link, its
  # target holds the output, nothing left beside either.
  mkdir -p "$TMP/real" "$TMP/links"
  echo old > "$TMP/real/out"
  ln -s ../real/out "$TMP/links/out"
  write_with $k "$TMP/links/out" 2>"$TMP/err"
  [ -L "$TMP/links/out" ] && pass || fail "$k: the symlink was replaced by a file"
  if [ $k = plot ] || [ $k = svg ]; then  # the SVGs carry no timestamps: the same bytes
    cmp -s "$TMP/real/out" "$TMP/ref.$k" && pass || fail "$k: the link's target does not hold the output"
  else
    [ "$(head -c 3 "$TMP/real/out" | tr -d "\0")" != old ] && [ -s "$TMP/real/out" ] && pass \
      || fail "$k: the link's target was not written: $(cat "$TMP/err")"
  fi
  [ -z "$(find "$TMP/links" "$TMP/real" -name "*.tmp*")" ] && pass || fail "$k: a temporary was left"
  rm -rf "$TMP/real" "$TMP/links"

  # A character device of our own (root only): /dev/null's twin stays a device.
  if [ "$(id -u)" = 0 ]; then
    mknod "$TMP/null" c 1 3
    write_with $k "$TMP/null" 2>"$TMP/err"
    [ -c "$TMP/null" ] && pass || fail "$k: the device node was replaced ($(stat -c %F "$TMP/null"))"
    rm -f "$TMP/null"
  fi
done

# A FIFO nobody reads yet: the open waits for a reader, and says so (it
# hung in silence: ob-launch --metrics FIFO before the ob-watch that reads it).
mkfifo "$TMP/late"
"$PLAN" --nodes 2 -f 0 -B 8 -o "$TMP/late" "$TMP/tiny.pb" 2> "$TMP/late.err" &
writer=$!
waiting() { grep -q "late: a FIFO that nobody reads yet; waiting for a reader" "$TMP/late.err"; }
for _ in $(seq 100); do waiting && break; sleep 0.05; done
waiting && pass || fail "no word of the wait: $(cat "$TMP/late.err")"
cat "$TMP/late" > "$TMP/late.pb"
wait "$writer" && cmp -s <("$PLAN" --explain "$TMP/late.pb") <("$PLAN" --explain "$TMP/ref.plan") && pass \
  || fail "the plan through a late-read FIFO: $(cat "$TMP/late.err")"

# A directory is refused with one line naming it.
mkdir "$TMP/dir"
expect 74 "dir: is a directory" -- "$PLAN" --nodes 2 -f 0 -B 8 -o "$TMP/dir" "$TMP/tiny.pb"
finish
