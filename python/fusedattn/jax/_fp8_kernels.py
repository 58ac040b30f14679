"""cuDNN's FP8 calls as the FP8 paths of fusedattn.jax run them: the call of a pass on FP8 arrays
(attention()'s vmap rule and partitioning included), the forward with its scaling scalars, and the
amaxes the kernels report written into the state."""
import jax.numpy as jnp

from .. import _config
from ._calls import FORWARD
from ._fp8_state import SLOT
from ._kernels import pass_function


def fp8_pass(pass_, call, q, k):
    """The FP8 `pass_` of `call` on q and k's heads, with attention()'s vmap rule and partitioning
    (its kernel from _kernels.KERNELS: the CUDA call, or what a test put there)."""
    heads = _config.AXES[call.config.layout][1]
    return pass_function(pass_, call, (q.shape[heads], k.shape[heads]))


def fp8_forward(call, q8, k8, v8, *, descales, state, lengths=()):
    """cuDNN's FP8 forward of q8, k8, v8 with their `descales`: (o8, the statistics, the state with the
    kernel's amaxes of S and O). O's scale must be set in the state first. `lengths`: (seq_len_q,
    seq_len_kv), int32 [b], for a call of runtime lengths, else ()."""
    scale, descale = state.scale, state.descale
    o8, stats, amax_s, amax_o = fp8_pass(FORWARD, call, q8, k8)(q8, k8, v8, *lengths, *descales, descale[SLOT["s"]],
                                                                scale[SLOT["s"]], scale[SLOT["o"]])
    return o8, stats, state._set("amax", ("s", "o"), jnp.stack([amax_s, amax_o]))


def with_backward_amaxes(state, amaxes):
    """The state with the amaxes a backward reported (amax_d_q, amax_d_k, amax_d_v, amax_d_p)."""
    return state._set("amax", ("d_q", "d_k", "d_v", "d_p"), jnp.stack(list(amaxes)))
