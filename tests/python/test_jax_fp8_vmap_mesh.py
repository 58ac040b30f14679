"""fusedattn.jax.fp8_attention under vmap and on a mesh, without a GPU: each mapped element gets the
amaxes and scales of a call of its own, and on 8 host devices each device runs its shard while the
state stays the whole tensors' (the plain-JAX FP8 kernel of jax_fp8_reference.py standing in for
cuDNN's)."""
import functools
import os
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax", reason="JAX not installed")
fj = pytest.importorskip("fusedattn.jax")
pytest.importorskip("fusedattn._jax_ffi", reason="the XLA FFI handlers were not built (jax was missing at configure)")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402  (JAX brings it; a machine without JAX may lack it)

from jax_fp8_reference import SLOT, inputs, rel_l2, training_step  # noqa: E402
from jax_fp8_reference import reference_kernels  # noqa: E402, F401  (a fixture: pytest finds it here)


def test_vmap_gives_each_element_the_amaxes_and_scales_of_a_call_of_its_own(reference_kernels):
    # Three problems with different ranges at once: each element's O, gradients and state must be
    # what its own call gives (a call folded into one batch would share one amax among them). On the
    # host CPU even where a GPU is present: XLA's GPU compiler computes the stand-in kernel's float32
    # math apart in the mapped and the single program (O 0.064 apart on the H200, one E4M3 rounding
    # of most elements); test_jax_fp8_gpu.py has the same check with cuDNN's kernels.
    with jax.default_device(jax.devices("cpu")[0]):
        check_vmap_gives_each_element_its_own_call()


def check_vmap_gives_each_element_its_own_call():
    elements = [inputs(i, kv_heads=2, amax=(1.0 + i, 2.0, 3.0 * (i + 1))) for i in range(3)]
    q, k, v, w = (jnp.stack(x) for x in zip(*elements))
    step, state = training_step(True), fj.fp8_state("delayed", history=4)
    _, o, grads, after = jax.vmap(step, in_axes=(0, 0, 0, None, 0))(q, k, v, state, w)
    assert after.amax.shape == (3,) + state.amax.shape  # the state comes back mapped
    assert len({float(a) for a in after.amax[:, SLOT["v"]]}) == 3
    for i, element in enumerate(elements):
        _, want_o, want_grads, want_state = step(*element[:3], state, element[3])
        assert rel_l2(o[i], want_o) < 1e-3
        assert max(rel_l2(g[i], want) for g, want in zip(grads, want_grads)) < 1e-3
        for ours, want in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(want_state)):
            np.testing.assert_allclose(ours[i], want, rtol=1e-5)


MESH_CHILD = r"""
import sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
import jax_fp8_reference as t
import fusedattn.jax as fj
from fusedattn.jax._calls import BACKWARD, FORWARD
from fusedattn.jax._kernels import KERNELS

SHAPES = set()  # q's shape at each kernel call, as traced


def recorded(kernel):
    def run(call, *arrays):
        SHAPES.add(tuple(arrays[0].shape))
        return kernel(call, *arrays)
    return run


KERNELS.update({FORWARD: recorded(t.fp8_forward), BACKWARD: recorded(t.fp8_backward)})
mesh = jax.make_mesh((2, 4), ("data", "model"))
split = NamedSharding(mesh, P("data", None, "model", None))  # bshd: batch over "data", heads over "model"
step = t.training_step(True)
for recipe in sys.argv[2:]:  # each recipe's lines start with its name
    SHAPES.clear()
    jax.clear_caches()  # the kernels are recorded as traced and lowered: a cached lowering would hide one
    whole_state = sharded_state = fj.fp8_state(recipe, history=4)
    for i in range(2):  # the second step runs on scales the first one's amaxes set
        q, k, v, w = t.inputs(i, shape=(4, 64, 8, 64), kv_heads=4, amax=(1.0, 2.0, 3.0 + i))
        _, o, grads, whole_state = step(q, k, v, whole_state, w)
        arrays = [jax.device_put(x, split) for x in (q, k, v, w)]
        _, sharded_o, sharded_grads, sharded_state = step(*arrays[:3], sharded_state, arrays[3])
        print(recipe, "OUT_ERR", t.rel_l2(sharded_o, o))
        print(recipe, "GRAD_ERR", max(t.rel_l2(g, want) for g, want in zip(sharded_grads, grads)))
        print(recipe, "STATE_ERR", max(float(jnp.max(jnp.abs(a - b) / jnp.maximum(jnp.abs(b), 1e-30)))
                                       for a, b in zip(jax.tree_util.tree_leaves(sharded_state),
                                                       jax.tree_util.tree_leaves(whole_state))))
        print(recipe, "SPECS", sharded_o.sharding.spec == split.spec,
              [g.sharding.spec == split.spec for g in sharded_grads])
    text = step.lower(*arrays[:3], sharded_state, arrays[3]).compile().as_text()
    print(recipe, "GATHERS", sum(text.count(op) for op in ("all-gather", "all-to-all", "collective-permute")))
    print(recipe, "SHAPES", sorted(SHAPES))
"""
RECIPES = ("current", "delayed")
# The child's programs run once on small arrays: LLVM's optimization of the host code would cost
# more than it saves, and changes nothing the test looks at.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@functools.cache
def mesh_child():
    """One child process on 8 host devices checking every recipe: its (recipe, NAME, value) lines
    and its stdout, made by the first test that asks."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8 " + FAST_COMPILE,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", MESH_CHILD, os.path.dirname(__file__), *RECIPES], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [line.split(" ", 2) for line in done.stdout.splitlines() if line.count(" ") >= 2], done.stdout


@pytest.mark.parametrize("recipe", RECIPES)
def test_under_a_mesh_each_device_runs_its_shard_and_the_state_is_the_whole_tensors(recipe):
    lines, stdout = mesh_child()
    lines = [(key, value) for name, key, value in lines if name == recipe]
    for key, value in lines:
        if key in ("OUT_ERR", "GRAD_ERR"):
            assert float(value) < 1e-3, stdout  # a few FP8 roundings may fall the other way
        if key == "STATE_ERR":  # every amax, scale and history: each shard's amaxes were maxed over all
            assert float(value) < 1e-5, stdout
        if key == "SPECS":
            assert value == "True [True, True, True]", stdout
    values = dict(lines)
    assert values["GATHERS"] == "0", stdout  # only reductions of amaxes cross the devices
    assert values["SHAPES"] == "[(2, 64, 2, 64), (4, 64, 8, 64)]", stdout  # per shard, and the whole one
