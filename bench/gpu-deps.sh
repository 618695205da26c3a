#!/usr/bin/env bash
# Fetches the .deb files bench/gpu.sh unpacks on a lent GPU machine (which
# has no package registry): our dependencies other than LibTorch and NCCL,
# from this machine's apt lists (Debian bookworm), into .deps/debs; bookworm's
# Gloo headers into .deps/debs-gloo for wheels without their own. Nothing is
# installed. Then: device run with carry [".deps"].
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.deps/debs" "$root/.deps/debs-gloo"
cd "$root/.deps/debs"
apt-get download -q protobuf-compiler libprotoc32 libprotobuf-dev libprotobuf32 libprotobuf-lite32 \
  zlib1g-dev libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev libuv1-dev libuv1 libsodium-dev libsodium23 \
  libxxhash-dev libxxhash0 catch2 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 \
  libzstd-dev libzstd1 libsimdjson-dev libsimdjson14
cd "$root/.deps/debs-gloo"
apt-get download -q libgloo-dev libgloo0
du -sh "$root/.deps"
