#!/usr/bin/env bash
# bench/gpu.sh's NCCL phase (bench/gpu_nccl.sh), dry-run on the CPU (Gloo in
# place of NCCL), so that a bug in it cannot waste a lent GPU's few minutes:
# gpt-tiny in bf16, 2 pipelines x 2 stages and a tp-2 host against one
# worker within bf16's tolerance, and, from OB_TEST_NCCL_HOSTS=1, each of the
# workers with an NCCL_HOSTID of its own (the 4 hosts', and the 2 slots' of
# the one tp host: NCCL refuses two ranks of one host on one GPU). The kill
# and stall parts are the same code as tests/process/launch_llama.sh's and
# launch_stall.sh's, which run here already; bench/gpu.sh runs all four.
NAME=gpu_nccl_dry
OB_BIN=${OB_BIN:?OB_BIN must name the directory holding ob-launch}
OB_SOURCE_DIR=${OB_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$OB_SOURCE_DIR/tests/lib/python.sh"
python3 -c 'import json' 2> /dev/null || { echo "$NAME: skipped: no python3" >&2; exit 77; }
out=$(DEVICE=cpu MODEL=gpt-tiny PARTS="pp tp" bash "$OB_SOURCE_DIR/bench/gpu_nccl.sh")
rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "$NAME: FAIL: bench/gpu_nccl.sh exited $rc" >&2; exit 1; }
for part in ref pp tp; do
  grep -q "^gpt-tiny $part: ok: " <<< "$out" || { echo "$NAME: FAIL: no passing $part line" >&2; exit 1; }
done
ids=$(grep "^gpt-tiny pp: ok: " <<< "$out" | sed 's/.*NCCL_HOSTID //')
[ "$(tr ' ' '\n' <<< "$ids" | sed 's/^t[0-9x]*//' | sort | tr '\n' ' ')" = "h1/0 h2/0 h3/0 h4/0 " ] \
  || { echo "$NAME: FAIL: the 2 x 2 workers' NCCL_HOSTID: $ids" >&2; exit 1; }
ids=$(grep "^gpt-tiny tp: ok: " <<< "$out" | sed 's/.*NCCL_HOSTID //')
[ "$(tr ' ' '\n' <<< "$ids" | sed 's/^t[0-9x]*//' | sort | tr '\n' ' ')" = "h1/0 h1/1 " ] \
  || { echo "$NAME: FAIL: the tp host's workers' NCCL_HOSTID: $ids" >&2; exit 1; }
echo "$NAME: ok"
