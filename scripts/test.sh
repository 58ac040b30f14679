#!/usr/bin/env bash
# Every test tier: CPU (always), GPU (skips with its reason without a GPU), and the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)"
