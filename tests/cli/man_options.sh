# Every tool's --help and its man page list the same long options.
source "$(dirname "$0")/../lib/assert.sh"
for page in "$OB_SOURCE_DIR"/man/ob-*.1.scd; do
  tool=$(basename "$page" .1.scd)
  "$OB_BIN/$tool" --help | grep -E '^ +-' | grep -Eo -- '--[a-z][a-z0-9-]*' | sort -u > "$TMP/help"
  sed -n '/^# OPTIONS/,/^# EXIT STATUS/p' "$page" | grep -Eo -- '--[a-z][a-z0-9-]*' | sort -u > "$TMP/man"
  if cmp -s "$TMP/help" "$TMP/man"; then pass; else
    fail "$tool: --help and man page differ: $(diff "$TMP/help" "$TMP/man" | grep '^[<>]' | tr '\n' ' ')"
  fi
  for section in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLES; do
    grep -q "^# $section" "$page" && pass || fail "$tool: man page lacks $section"
  done
done
finish
