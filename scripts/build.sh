#!/usr/bin/env bash
# Configures and builds fusedattn into build/ (after scripts/setup.sh). Used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# The Python module (fusedattn._core) needs nanobind; setup.sh installs it where pip can.
python=OFF
if python3 -c "import nanobind" 2>/dev/null; then
  python=ON
else
  echo "build: the Python module is left out: nanobind is not installed (python3 -m pip install nanobind)"
fi
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFUSEDATTN_PYTHON=$python
elif ! grep -q "^FUSEDATTN_PYTHON:BOOL=$python$" build/CMakeCache.txt; then
  cmake -S . -B build -DFUSEDATTN_PYTHON=$python >/dev/null
fi
cmake --build build -j "$(nproc)"
