#!/usr/bin/env bash
# Another cuDNN's libraries for the GPU machine, which has no network: packed here from a
# nvidia-cudnn-cu13 wheel into compressed parts small enough to travel with one device call each
# (the device tool's `carry`), unpacked there into one folder that gpu_run.sh's `cudnn` part loads
# through LD_LIBRARY_PATH. Only what the graph API's attention uses travels: the loader
# (libcudnn.so.9), the graph library, the engines and the heuristics; the legacy APIs' libraries
# (adv, cnn, ops) stay behind.
#
#   bash scripts/cudnn_libs.sh pack nvidia_cudnn_cu13-9.28.1.4-*.whl   # -> build-cudnn/9.28.1.4/part-*
#   bash scripts/cudnn_libs.sh unpack build-cudnn/9.28.1.4             # -> build-cudnn/9.28.1.4/lib
#
# build-cudnn/ is ignored by git (build*/), so the parts travel only where a call names them.
set -euo pipefail
cd "$(dirname "$0")/.."
PART_BYTES=${PART_BYTES:-55000000}  # with .deps (7 MB) under the 64 MiB a call carries
LIBS=(libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9 libcudnn_engines_precompiled.so.9
      libcudnn_engines_tensor_ir.so.9 libcudnn_heuristic.so.9)

case "${1:-}" in
  pack)
    wheel=$2
    version=$(basename "$wheel" | sed -E 's/^nvidia_cudnn_cu13-([0-9.]+)-.*/\1/')
    out=build-cudnn/$version
    work=$(mktemp -d)
    rm -rf "$out" && mkdir -p "$out"
    names=()
    for lib in "${LIBS[@]}"; do
      if unzip -q -o "$wheel" "nvidia/cudnn/lib/$lib" -d "$work" 2>/dev/null; then names+=("$lib"); fi
    done
    tar -C "$work/nvidia/cudnn/lib" -cf - "${names[@]}" | xz -6 -T0 | split -b "$PART_BYTES" -d -a 2 - "$out/part-"
    rm -rf "$work"
    echo "cudnn_libs: cuDNN $version (${names[*]}) in $(ls "$out" | wc -l) parts:"
    ls -l "$out"
    ;;
  unpack)
    dir=$2
    rm -rf "$dir/lib" && mkdir -p "$dir/lib"
    # Python's lzma: the GPU machine need not have xz.
    cat "$dir"/part-* | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" |
      tar -C "$dir/lib" -xf -
    echo "cudnn_libs: $(ls "$dir/lib" | wc -l) libraries in $dir/lib"
    ;;
  *)
    echo "usage: cudnn_libs.sh pack WHEEL | unpack FOLDER" >&2
    exit 2
    ;;
esac
