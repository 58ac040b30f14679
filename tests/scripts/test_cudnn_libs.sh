#!/usr/bin/env bash
# CPU tier: scripts/cudnn_libs.sh packs a cuDNN wheel's libraries into parts and unpacks them back
# byte for byte (the GPU machine's way to another cuDNN), leaving the legacy APIs' libraries behind.
# A made-up wheel: the zip layout of nvidia-cudnn-cu13, random bytes for libraries.
set -euo pipefail
for tool in unzip xz; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed (scripts/cudnn_libs.sh packs with it)"; exit 77; }
done
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheel/nvidia/cudnn/lib"
for lib in libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9 libcudnn_heuristic.so.9 \
           libcudnn_adv.so.9; do
  head -c $((200000 + RANDOM)) /dev/urandom >"$work/wheel/nvidia/cudnn/lib/$lib"
done
wheel=$work/nvidia_cudnn_cu13-9.99.0.1-py3-none-manylinux_2_27_x86_64.whl
(cd "$work/wheel" && python3 -c "import shutil; shutil.make_archive('$work/w', 'zip', '.')" && mv "$work/w.zip" "$wheel")
copy=$work/repo
mkdir -p "$copy/scripts" && cp "$repo/scripts/cudnn_libs.sh" "$copy/scripts/"
PART_BYTES=300000 bash "$copy/scripts/cudnn_libs.sh" pack "$wheel" >/dev/null
parts=$(ls "$copy/build-cudnn/9.99.0.1" | grep -c '^part-')
[ "$parts" -ge 2 ] || { echo "expected several parts, got $parts"; exit 1; }
bash "$copy/scripts/cudnn_libs.sh" unpack "$copy/build-cudnn/9.99.0.1" >/dev/null
for lib in libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9 libcudnn_heuristic.so.9; do
  cmp "$work/wheel/nvidia/cudnn/lib/$lib" "$copy/build-cudnn/9.99.0.1/lib/$lib"
done
[ ! -e "$copy/build-cudnn/9.99.0.1/lib/libcudnn_adv.so.9" ] || { echo "the legacy library travelled"; exit 1; }
echo "cudnn_libs: $parts parts, 4 libraries back byte for byte, the legacy one left behind"
