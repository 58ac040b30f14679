"""The kernel behind each pass of fusedattn.jax, and a pass as a function of arrays with its vmap
rule (_batching) and its partitioning (_partition): what attention(), paged_attention() and FP8
attention call. Context parallelism calls the kernels themselves (inside shard_map every array is
already one device's)."""
import functools

from . import _batching, _custom_call, _partition
from ._calls import BACKWARD, FORWARD

# The kernel behind each pass, kernel(call, *arrays): the custom call, or what a test put here (plain
# JAX references that check batching, partitioning and context parallelism without a GPU). Looked up
# when a call is traced, so a test's change reaches functions made before it.
KERNELS = {pass_: functools.partial(_custom_call.run, pass_) for pass_ in (FORWARD, BACKWARD)}


def kernel(pass_):
    """The kernel of `pass_` now in KERNELS."""
    return KERNELS[pass_]


# Bounded at the core's default plan-cache cap, 512 (plan_cache.h): an entry, (pass, Call, heads),
# stands for at least one plan (a plan adds the arrays' shapes), so a program whose plans fit the
# core's cache finds all its functions here too. A miss past it only makes the function again while
# tracing (no plan, no compile: jit keeps compiled programs by its own key).
@functools.lru_cache(maxsize=512)
def pass_function(pass_, call, heads):
    """The `pass_` of `call` on arrays with `heads`, (h_q, h_kv): a function of arrays alone, with
    its vmap rule and its partitioning."""
    heads_q, heads_kv = heads
    partitioned = _partition.partitioned(kernel, pass_, call, heads_q=heads_q, heads_kv=heads_kv)
    return _batching.with_batching(partitioned, pass_, call)
