"""fusedattn.jax — the JAX adapter: XLA FFI custom calls into the same core.

    from fusedattn.jax import attention
    out = attention(q, k, v, causal=True)     # [batch, seq, heads, dim], like jax.nn.dot_product_attention

It only translates: a call's keyword arguments become one frozen core Config (fusedattn/_config.py,
shared with fusedattn.torch), and the core builds and validates the spec from it and the arrays'
shapes while tracing. The spec travels, printed by the core, as the custom call's attribute;
XLA's INSTANTIATE stage parses it, the INITIALIZE stage before each execution makes sure the plan
for that device exists (built once), and the execute stage only enqueues it on XLA's stream, with
a workspace XLA planned as one of the call's results, so it is safe for command buffers.

Differentiable (jax.custom_vjp over the core's backward); works under jit, grad, jax.checkpoint
and vmap (_batching: the mapped axis joins the batch where it can). Under a mesh with q, k, v
sharded over batch and heads, each device calls on its own shard and nothing is gathered
(_partition).

Beneath this file, each imports only what lies below it: the public calls (_attention, _paged,
_fp8_attention, _context_parallel) -> what they share (_kernels: the kernel of each pass with its
vmap rule and partitioning; _calls: what fixes a call; _custom_call: the XLA FFI call) -> the
framework-neutral fusedattn modules -> fusedattn._core.
"""
from ._attention import attention
from ._context_parallel import context_parallel_attention
from ._context_parallel_order import load_balance, unbalance
from ._fp8_attention import fp8_attention
from ._fp8_state import Fp8State, fp8_state
from ._paged import paged_attention

__all__ = ["attention", "paged_attention", "Fp8State", "fp8_state", "fp8_attention", "context_parallel_attention",
           "load_balance", "unbalance"]
