#!/usr/bin/env bash
# HTTP codec offload benchmark: small requests' latency on a connection that shares its
# I/O loop with a client sending large gzip-compressed JSON requests, with the codec work
# on the loop (--http-codec-thread-count 0) and on the codec threads (the default), side
# by side in one run. Writes bench/results/http_offload.json.
#   bench/http_offload/run.sh [--values N] [--seconds S] [--out DIR]
# Needs a build (SHOAL_BUILD, default build: scripts/build.sh); python3 stdlib only.
# Everything listens on 127.0.0.1. About 40 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 bench/http_offload/offload.py "$@"
