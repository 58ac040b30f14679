#!/usr/bin/env bash
# Installs what the build needs that the system does not provide: the cuDNN frontend headers,
# pinned, from PyPI, into .deps/ (ignored by git). Safe to run again; does nothing when present.
set -euo pipefail
cd "$(dirname "$0")/.."
FRONTEND_VERSION=1.32.0

# GoogleTest's source, copied so that it can travel to machines without a package manager.
if [ ! -f .deps/googletest/CMakeLists.txt ] && [ -f /usr/src/googletest/CMakeLists.txt ]; then
  mkdir -p .deps && cp -r /usr/src/googletest .deps/googletest
fi

# The Python tier's build and test tools, where pip can install them (small; the tier is skipped,
# saying so, where it cannot).
for module in nanobind pytest; do
  python3 -c "import $module" 2>/dev/null || python3 -m pip install --quiet "$module" 2>/dev/null ||
    echo "setup: could not install $module with pip; the Python tier will be skipped"
done

dest=.deps/cudnn_frontend
if grep -qs "PATCH_VERSION 0" "$dest/include/cudnn_frontend_version.h" &&
   grep -qs "MINOR_VERSION 32" "$dest/include/cudnn_frontend_version.h"; then
  exit 0
fi
rm -rf "$dest" && mkdir -p "$dest"
# The wheel is header-only for our purposes; --no-deps keeps its Python extras out.
python3 -m pip install --quiet --no-deps --target "$dest" "nvidia-cudnn-frontend==${FRONTEND_VERSION}"
# Keep only the headers: the rest (the Python module and its binary) is large and unused, and the
# folder travels to the GPU machine with every run.
find "$dest" -mindepth 1 -maxdepth 1 ! -name include -exec rm -rf {} +
test -f "$dest/include/cudnn_frontend.h" || { echo "setup: nvidia-cudnn-frontend==${FRONTEND_VERSION} has no include/cudnn_frontend.h" >&2; exit 1; }
echo "setup: cuDNN frontend ${FRONTEND_VERSION} headers in $dest/include"
