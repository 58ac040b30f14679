#!/usr/bin/env bash
# Configures and builds fusedattn into build/ (after scripts/setup.sh). Used by demo.sh and test.sh.
# The Python tier is built for, and its tests run under, the first python3 on PATH (.ci/run puts its
# virtual environment's there); a build folder configured for another one is configured again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# The interpreter itself, not a launcher in front of it (pyenv's shims), so the cache names what
# actually runs; a virtual environment's python stays its own (its packages are the point).
python_path=$(python3 -c "import sys; print(sys.executable)")
# The Python module (fusedattn._core) needs nanobind; setup.sh installs it where pip can.
python=OFF
if python3 -c "import nanobind" 2>/dev/null; then
  python=ON
else
  echo "build: the Python module is left out: nanobind is not installed (python3 -m pip install nanobind)"
fi
# Python_: the module and the Python tier's tests; Python3_: cuDNN's lookup and the export checks.
options=(-DFUSEDATTN_PYTHON=$python "-DPython_EXECUTABLE:FILEPATH=$python_path" "-DPython3_EXECUTABLE:FILEPATH=$python_path")
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${options[@]}"
elif ! grep -qx "FUSEDATTN_PYTHON:BOOL=$python" build/CMakeCache.txt ||
     ! grep -qxF "Python_EXECUTABLE:FILEPATH=$python_path" build/CMakeCache.txt; then
  echo "build: configuring build/ again for FUSEDATTN_PYTHON=$python with $python_path"
  cmake -S . -B build "${options[@]}" >/dev/null
fi
cmake --build build -j "$(nproc)"
