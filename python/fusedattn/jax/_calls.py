"""What fixes one of fusedattn.jax's calls into the core (Call: the core Config and the little it
cannot hold), and the arrays each pass takes and returns, by role.

A pass's arrays come in a fixed order with roles, decided by the Config (the handler,
python/bindings/jax_ffi.cpp, reads the same order from the spec the Config makes):
    forward:  q, k, v, [bias], [sink], [rng], [[seq_len_q], seq_len_kv],
              [cu_seqlens_q, cu_seqlens_kv], [page_table_k, page_table_v], [mod_scalars], [mod_t0 ..]
    backward: q, k, v, o, stats, d_o, then the same optional ones (never paged)
(mod_*: a score modifier's float32 scalars [n] and its tensors, fusedattn/score_mod.h; seq_len_q is
left out of a padded dense call without Call.query_lengths, a paged decode's every row of q)
and it returns o, [stats], [max_logit] (forward) or d_q, d_k, d_v, [d_bias], [d_sink] (backward);
every call also returns its workspace, which the kernels drop. An FP8 call (Call.fp8: q, k, v in
E4M3 or E5M2, fusedattn/fp8_scales.h) takes float32 scalars after all of those and returns the
amaxes its kernels write after its other results, both in the order of the core's table
(fusedattn/tensor_slots.h, read here through core.fp8_scale_slots), e.g. for the forward:
    ... descale_q, descale_k, descale_v, descale_s, scale_s, scale_o -> ... amax_s, amax_o
and a call over an FP8 K/V cache (Call.fp8_cache) takes that cache's descale_k, descale_v last
(float32 [] or [h_kv]) and returns nothing more.
"""
import dataclasses
from typing import Tuple

import jax.numpy as jnp

from .. import _config
from .. import _core as core

FORWARD, BACKWARD = _config.FORWARD, _config.BACKWARD
STATS = "stats"


# An FP8 call's scalar operands and the amaxes it returns, from the core's one table, so they come
# in the order jax_ffi.cpp reads them.
def _fp8_slots(role):
    return {p: tuple(name for name, r in core.fp8_scale_slots(p) if r == role) for p in (FORWARD, BACKWARD)}


FP8_INPUTS, FP8_OUTPUTS = _fp8_slots("scale"), _fp8_slots("amax")
# An FP8 K/V cache's descales (beside 16-bit queries: a forward's, the paged call's), after all others.
FP8_CACHE_INPUTS = tuple(name for name, _ in core.fp8_scale_slots(FORWARD, kv_cache=True))


def view(x):
    """An array as the core takes it: (dtype name, shape, element strides); JAX arrays are dense
    and row-major."""
    strides, step = [], 1
    for size in reversed(x.shape):
        strides.append(step)
        step *= size
    return jnp.dtype(x.dtype).name, tuple(x.shape), tuple(reversed(strides))


def as_int32(x):
    """Lengths, offsets and page tables as the calls take them."""
    return jnp.asarray(x, jnp.int32)


@dataclasses.dataclass(frozen=True)
class Call:
    """What fixes a call beyond its arrays' shapes: the core Config (every option, shared with
    fusedattn.torch), the scale, and for thd the longest sequences (the plan's bucket: host values
    the arrays do not carry), and whether q, k, v are FP8 (then the call takes and returns its
    scaling scalars), and whether a padded dense call passes seq_len_q (else every sequence has all
    of q's rows: the handler gets no array, so a decode step fills none), and whether k and v are an
    FP8 cache beside 16-bit q (then the call takes their descales, fusedattn/_fp8_cache.py).
    Hashable: calls are cached and traced by it."""
    config: core.Config
    scale: float
    max_seqlen: Tuple[int, int] = (0, 0)
    fp8: bool = False
    query_lengths: bool = True
    fp8_cache: bool = False

    @property
    def ragged(self):
        """Sequences placed by cumulative offsets (cu_seqlens_q, cu_seqlens_kv)."""
        return "thd" in (self.config.layout, self.config.kv_layout)

    def spec(self, q, k, v, sequences=0):
        """The validated spec of this call on q, k, v (for paged calls k, v are the pools): the core
        checks everything here, while tracing, with the words it uses for every adapter."""
        return self.config.spec(view(q), view(k), view(v), sequences, *self.max_seqlen)

    def inputs(self, pass_):
        c = self.config
        fixed = ("q", "k", "v") if pass_ == FORWARD else ("q", "k", "v", "o", STATS, "d_o")
        return (fixed + (("bias",) if c.bias != "none" else ()) + (("sink",) if c.softmax == "sink" else ())
                + (("rng",) if c.dropout > 0.0 else ())
                + ((("seq_len_q",) if self.query_lengths else ()) + ("seq_len_kv",)
                   if c.padding and not self.ragged else ())
                + (("cu_q", "cu_kv") if self.ragged else ())
                + (("page_table_k", "page_table_v") if c.kv_pages else ())
                + (("mod_scalars",) if c.score_mod_scalars else ())
                + tuple(f"mod_t{i}" for i in range(len(c.score_mod_tensor_axes)))
                + (FP8_INPUTS[pass_] if self.fp8 else ()) + (FP8_CACHE_INPUTS if self.fp8_cache else ()))

    def outputs(self, pass_):
        c = self.config
        fp8 = FP8_OUTPUTS[pass_] if self.fp8 else ()
        if pass_ == FORWARD:
            return ("o",) + ((STATS,) if c.stats else ()) + (("max_logit",) if c.max_logit != "none" else ()) + fp8
        return (("d_q", "d_k", "d_v") + (("d_bias",) if c.bias_grad else ())
                + (("d_sink",) if c.softmax == "sink" else ()) + fp8)


def traced_call(config, q, k, v, *, scale=None, max_seqlen=(0, 0), sequences=0):
    """The Call of `config` on these arrays, and its spec on them: the core validates the whole
    call here, while tracing, in the words it uses for every adapter. scale: None for the spec's
    default; max_seqlen: thd's longest sequences (q, kv), host ints; sequences: thd's count."""
    max_seqlen = (int(max_seqlen[0]), int(max_seqlen[1]))
    spec = config.spec(view(q), view(k), view(v), sequences, *max_seqlen)
    return Call(config, spec.default_scale if scale is None else float(scale), max_seqlen), spec
