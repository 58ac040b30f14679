#!/usr/bin/env bash
# The package as a user gets it: a fresh virtual environment, the newest PyTorch and JAX on PyPI,
# then plain `pip install .` (pip's isolated build, the declared dependencies), and the tests that
# need no GPU run against what was installed rather than the build tree: import, the no-GPU answers,
# both adapters traced (meta tensors, jax.jit(...).lower for CUDA), and fusedattn.torch's C++ path
# compiled for that PyTorch. GPU tests skip with their reason; on a GPU machine they run too.
#
#   bash scripts/test_installed.sh            # FUSEDATTN_PACKAGE_VENV: where (default ~/.cache/...)
#   PACKAGE_REQUIREMENTS="torch==2.11.0 jax==0.10.2" bash scripts/test_installed.sh   # other versions
#   FUSEDATTN_WHEEL=dist/fusedattn-*.whl bash scripts/test_installed.sh  # a wheel built elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
venv=$(realpath -m "${FUSEDATTN_PACKAGE_VENV:-$HOME/.cache/fusedattn-package-venv}")
case "$venv/" in
  "$repo"/*) echo "test_installed: the virtual environment $venv is inside the repository" >&2; exit 1 ;;
esac
read -r -a requirements <<<"${PACKAGE_REQUIREMENTS:-torch jax pytest}"
[[ " ${requirements[*]} " == *" pytest"* ]] || requirements+=(pytest)

rm -rf "$venv"
python3 -m venv "$venv"
echo "test_installed: pip install ${requirements[*]} into a fresh $venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "${requirements[@]}"
started=$SECONDS
if [ -n "${FUSEDATTN_WHEEL:-}" ]; then
  echo "test_installed: pip install $FUSEDATTN_WHEEL"
  "$venv/bin/python" -m pip install --quiet "$FUSEDATTN_WHEEL"
else
  echo "test_installed: pip install . (its own isolated build: minutes; pip install -v . shows each step)"
  "$venv/bin/python" -m pip install --quiet .
fi
echo "test_installed: installed in $((SECONDS - started)) s: $("$venv/bin/python" -m pip list 2>/dev/null |
  grep -iE '^(fusedattn|torch|jax|jaxlib|nvidia-cudnn-cu13) ' | tr -s ' ' | paste -sd ',' -)"

# From outside the tree, with no build tree on the path (conftest.py adds build/python unless
# FUSEDATTN_PYTHON_BUILD names another folder): the installed package is the one imported.
cd "$(mktemp -d)"
"$venv/bin/python" - <<'EOF'
import fusedattn, sys
where = fusedattn.__file__
assert "site-packages" in where, f"imported {where}, not the installed package"
print(f"test_installed: fusedattn from {where}")
EOF
FUSEDATTN_PYTHON_BUILD=/nonexistent OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
  --rootdir "$repo/tests/python" \
  "$repo/tests/python/test_package.py" "$repo/tests/python/test_no_gpu.py" "$repo/tests/python/test_bad_inputs.py" \
  "$repo/tests/python/test_torch_meta.py" "$repo/tests/python/test_torch_fast_path_build.py" \
  "$repo/tests/python/test_jax_cpu.py"
