# Each ob-ckpt command's --help and its part of the man page's COMMANDS
# section list the same long options (man_options.sh checks the top level).
source "$(dirname "$0")/../lib/assert.sh"
PAGE="$OB_SOURCE_DIR/man/ob-ckpt.1.scd"
for cmd in ls show verify export prune; do
  "$OB_BIN/ob-ckpt" "$cmd" --help | grep -E '^ +-' | grep -Eo -- '--[a-z][a-z0-9-]*' | grep -vx -- --help | sort -u > "$TMP/help"
  # The command's subsection: from "## cmd" to the next heading; options are
  # the lines that start with *-.
  sed -n "/^## $cmd\$/,/^#/{/^## $cmd\$/d;/^#/d;p}" "$PAGE" | grep -E '^\*-' | grep -Eo -- '--[a-z][a-z0-9-]*' | sort -u > "$TMP/man"
  grep -q "^## $cmd\$" "$PAGE" && pass || fail "man page lacks a '## $cmd' subsection"
  if cmp -s "$TMP/help" "$TMP/man"; then pass; else
    fail "ob-ckpt $cmd: --help and man page differ: $(diff "$TMP/help" "$TMP/man" | grep '^[<>]' | tr '\n' ' ')"
  fi
done
finish
