# Sourced by assert.sh and launch.sh. python3 runs often (every 50 ms while
# a test waits for a step): resolved once to the interpreter itself, not a
# version manager's shim (pyenv's shell scripts cost 0.1 s of CPU a call on
# a 2-core machine, taken from the workers under test).
if OB_PYTHON=$(command python3 -c 'import sys; print(sys.executable)' 2>/dev/null) && [ -x "$OB_PYTHON" ]; then
  python3() { "$OB_PYTHON" "$@"; }
fi
