"""fusedattn.flax — a Flax (nnx) attention layer over fusedattn.jax.attention.

    from flax import nnx
    from fusedattn.flax import MultiHeadAttention
    layer = MultiHeadAttention(num_heads=16, num_kv_heads=4, in_features=2048, causal=True, rngs=nnx.Rngs(0))
    y = layer(x)                 # x: [batch, seq, in_features]; self-attention
    y = layer(x, context)        # cross-attention over context: [batch, seq_kv, in_features]

Projections to queries, keys and values (fewer K/V heads for GQA/MQA), fused attention in JAX's
[batch, seq, heads, dim] layout, and the output projection. Activations run in `dtype` (float16
or bfloat16, what the kernels take); parameters are kept in `param_dtype`.
"""
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from . import _config
from .jax._calls import view
from .jax import attention

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nnx.Module):
    def __init__(self, num_heads: int, in_features: int, *, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, causal: bool = False, window: Tuple[int, int] = (-1, -1),
                 use_bias: bool = False, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs: nnx.Rngs):
        num_kv_heads = num_kv_heads or num_heads
        head_dim = head_dim or in_features // num_heads
        # The core checks the layer's call now, before any parameter exists, in the words it uses
        # for every call (heads, head dim, dtype, window); one token stands for the sequences.
        q, kv = (view(jax.ShapeDtypeStruct((1, 1, heads, head_dim), dtype)) for heads in (num_heads, num_kv_heads))
        _config.config("bshd", causal=causal, window=tuple(window)).spec(q, kv, kv)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.causal, self.window, self.dtype = causal, window, dtype

        def linear(features_in, features_out):
            return nnx.Linear(features_in, features_out, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                              rngs=rngs)
        self.query = linear(in_features, num_heads * head_dim)
        self.key = linear(in_features, num_kv_heads * head_dim)
        self.value = linear(in_features, num_kv_heads * head_dim)
        self.out = linear(num_heads * head_dim, in_features)

    def __call__(self, x, context=None):
        context = x if context is None else context
        (b, s, _), s_kv = x.shape, context.shape[1]
        q = self.query(x).reshape(b, s, self.num_heads, self.head_dim)
        k = self.key(context).reshape(b, s_kv, self.num_kv_heads, self.head_dim)
        v = self.value(context).reshape(b, s_kv, self.num_kv_heads, self.head_dim)
        o = attention(q, k, v, causal=self.causal, window=self.window)
        return self.out(o.reshape(b, s, self.num_heads * self.head_dim))
