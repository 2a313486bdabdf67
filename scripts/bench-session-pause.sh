#!/bin/sh
# Measures a session's pause, resume and fork against warm runs, on real
# VMs in a private state root (integration/sessions TestBenchSessionPause).
set -eu
cd "$(dirname "$0")/.."
ISOPOD_BENCH=1 exec go test -count=1 -v -timeout 30m -run TestBenchSessionPause ./integration/sessions/ "$@"
