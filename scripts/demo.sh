#!/usr/bin/env bash
# The main job: build, then run a standard attention problem forward and backward, checked
# against the reference, with its speed. Without a GPU it says so and runs the CPU reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/fusedattn info
./build/fusedattn demo
