"""fusedattn.jax's context parallelism: attention over sequences split across the devices of a mesh
axis, inside jax.shard_map, by ring (jax.lax.ppermute) or all-gather (jax.lax.all_gather), built on
the core's forward and backward and their log-sum-exp:

    mesh = jax.make_mesh((4,), ("cp",))
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P(None, "cp"), out_specs=P(None, "cp"))
    def attend(q, k, v):                      # each device: its part of the sequence axis (bshd)
        return fusedattn.jax.context_parallel_attention(q, k, v, axis_name="cp", causal=True)
    o = attend(*(load_balance(x, 4) for x in (q, k, v)))   # then unbalance(o, 4)

Causal attention with load_balanced=True (the default) wants device r to hold chunks r and 2N-1-r
of every sequence (load_balance arranges an array so), which gives every device the same causal
work; load_balanced=False takes chunk r on device r. The forward merges each block's O by its
log-sum-exp. The backward runs each block's backward with the merged O and statistics, which makes
each block's dS exact, and sums dK, dV where their block lives: in the ring the sums travel with
the blocks and take one more step home; with all-gather they are reduce-scattered. A block a causal
mask hides entirely is skipped, and a row that sees no key of a block takes a neutral statistic
(-inf: weight 0). The ring sends the next block before computing the current one, so XLA can hide
the transfer behind the attention.

Not yet: sliding windows, sinks, packed sequences (thd) and lengths under context parallelism.
"""
import functools

import jax
import jax.numpy as jnp

from . import _config
from ._jax_calls import BACKWARD, FORWARD
from .errors import invalid_argument

__all__ = ["context_parallel_attention", "load_balance", "unbalance"]

# A block's kind, for causal attention: the device's own keys, keys from an earlier device (or
# chunk), keys from a later one.
_LOCAL, _EARLIER, _LATER = 0, 1, 2


def load_balance(x, n, axis=1):
    """x with its `axis` (the sequence) reordered so that its n equal parts, as shard_map splits
    them, hold chunks (r, 2n-1-r) of 2n: part r's causal work is then the same for every r."""
    chunks = jnp.split(x, 2 * n, axis=axis)
    return jnp.concatenate([c for r in range(n) for c in (chunks[r], chunks[2 * n - 1 - r])], axis=axis)


def unbalance(x, n, axis=1):
    """The inverse of load_balance."""
    parts = jnp.split(x, 2 * n, axis=axis)
    order = [None] * (2 * n)
    for r in range(n):
        order[r], order[2 * n - 1 - r] = parts[2 * r], parts[2 * r + 1]
    return jnp.concatenate(order, axis=axis)


class _Blocks:
    """One device's block calls: the core's forward (O and statistics) and backward of q against a
    block of keys, masked causally from the top-left (a diagonal block) or not at all."""

    def __init__(self, scale):
        self.scale = scale

    def _kernel(self, pass_, causal, q, k, v):
        # The kernel itself (jax.py's _KERNELS: the CUDA call, or what a test put there): inside
        # shard_map every array is already this device's, so attention()'s partitioning has no part.
        from . import jax as adapter
        config = _config.config("bshd", causal=causal, stats=True)
        call, _ = adapter._traced(config, self.scale, (0, 0), q, k, v, 0)
        return functools.partial(adapter._kernel(pass_), call)

    def forward(self, q, k, v, causal):
        """(O in float32, statistics [b, h, s_q])."""
        o, stats = self._kernel(FORWARD, causal, q, k, v)(q, k, v)
        return o.astype(jnp.float32), stats

    def backward(self, q, k, v, o, stats, d_o, causal):
        d_q, d_k, d_v = self._kernel(BACKWARD, causal, q, k, v)(q, k, v, o, stats, d_o)
        return d_q.astype(jnp.float32), d_k.astype(jnp.float32), d_v.astype(jnp.float32)


def _zeros_like(x):
    """Float32 zeros of x's shape, made from x so that inside shard_map they vary over the mesh axis
    as x does (lax.switch wants its branches' results typed alike)."""
    return x.astype(jnp.float32) * 0.0


def _neutral(q):
    """No keys seen: O 0, statistics -inf."""
    return _zeros_like(q), jnp.transpose(_zeros_like(q[..., 0]), (0, 2, 1)) - jnp.inf


def _merge(a, b):
    """Two partial results (O float32 [b, s, h, d], statistics [b, h, s]) of the same rows over
    disjoint keys, as one."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    lse = jnp.logaddexp(lse_a, lse_b)
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    w_a = jnp.where(jnp.isfinite(lse_a), jnp.exp(lse_a - safe), 0.0)
    w_b = jnp.where(jnp.isfinite(lse_b), jnp.exp(lse_b - safe), 0.0)
    weight = lambda w: jnp.transpose(w, (0, 2, 1))[..., None]  # [b, h, s] -> [b, s, h, 1]
    return o_a * weight(w_a) + o_b * weight(w_b), lse


def _halves(x, axis=1):
    return jnp.split(x, 2, axis=axis)


def _concat(a, b, axis=1):
    return jnp.concatenate([a, b], axis=axis)


class _Plan:
    """Static settings of one call: the block kinds and how each runs, forward and backward."""

    def __init__(self, axis_name, causal, balanced, scale):
        self.axis, self.causal, self.balanced, self.blocks = axis_name, causal, balanced, _Blocks(scale)

    # --- one block of keys: forward --------------------------------------------------------------
    def block_forward(self, q, k, v, kind):
        """The partial result of q against one device's keys of `kind` (a traced index for the
        kinds that only the device index decides)."""
        if not self.causal:
            return self.blocks.forward(q, k, v, False)
        branches = [lambda q, k, v: self._local(q, k, v), lambda q, k, v: self._earlier(q, k, v),
                    lambda q, k, v: self._later(q, k, v)]
        if isinstance(kind, int):
            return branches[kind](q, k, v)
        return jax.lax.switch(kind, branches, q, k, v)

    def _local(self, q, k, v):
        if not self.balanced:  # chunk r against itself
            return self.blocks.forward(q, k, v, True)
        (q0, q1), (k0, k1), (v0, v1) = _halves(q), _halves(k), _halves(v)
        first = self.blocks.forward(q0, k0, v0, True)  # chunk r against itself; chunk 2n-1-r later
        second = _merge(self.blocks.forward(q1, k0, v0, False), self.blocks.forward(q1, k1, v1, True))
        return _concat(first[0], second[0]), _concat(first[1], second[1], axis=2)

    def _earlier(self, q, k, v):
        if not self.balanced:  # an earlier chunk: every key seen
            return self.blocks.forward(q, k, v, False)
        # Device s < r: both of r's chunks see s's first chunk whole, and neither its second.
        (k0, _), (v0, _) = _halves(k), _halves(v)
        return self.blocks.forward(q, k0, v0, False)

    def _later(self, q, k, v):
        if not self.balanced:  # a later chunk: nothing seen
            return _neutral(q)
        # Device s > r: r's first chunk sees nothing of s, its second chunk everything.
        q0, q1 = _halves(q)
        none, seen = _neutral(q0), self.blocks.forward(q1, k, v, False)
        return _concat(none[0], seen[0]), _concat(none[1], seen[1], axis=2)

    # --- one block of keys: backward -------------------------------------------------------------
    def block_backward(self, q, k, v, o, stats, d_o, kind):
        """(dQ of q's rows from these keys, dK, dV of these keys), float32, with the merged O and
        statistics of q's rows."""
        if not self.causal:
            return self.blocks.backward(q, k, v, o, stats, d_o, False)
        branches = [self._local_backward, self._earlier_backward, self._later_backward]
        if isinstance(kind, int):
            return branches[kind](q, k, v, o, stats, d_o)
        return jax.lax.switch(kind, branches, q, k, v, o, stats, d_o)

    def _local_backward(self, q, k, v, o, stats, d_o):
        if not self.balanced:
            return self.blocks.backward(q, k, v, o, stats, d_o, True)
        (q0, q1), (k0, k1), (v0, v1) = _halves(q), _halves(k), _halves(v)
        (o0, o1), (d0, d1), (s0, s1) = _halves(o), _halves(d_o), _halves(stats, axis=2)
        dq0, dk0, dv0 = self.blocks.backward(q0, k0, v0, o0, s0, d0, True)
        dq1a, dk0b, dv0b = self.blocks.backward(q1, k0, v0, o1, s1, d1, False)
        dq1b, dk1, dv1 = self.blocks.backward(q1, k1, v1, o1, s1, d1, True)
        return _concat(dq0, dq1a + dq1b), _concat(dk0 + dk0b, dk1), _concat(dv0 + dv0b, dv1)

    def _earlier_backward(self, q, k, v, o, stats, d_o):
        if not self.balanced:
            return self.blocks.backward(q, k, v, o, stats, d_o, False)
        (k0, k1), (v0, v1) = _halves(k), _halves(v)
        dq, dk0, dv0 = self.blocks.backward(q, k0, v0, o, stats, d_o, False)
        return dq, _concat(dk0, _zeros_like(k1)), _concat(dv0, _zeros_like(v1))

    def _later_backward(self, q, k, v, o, stats, d_o):
        zeros = _zeros_like
        if not self.balanced:
            return zeros(q), zeros(k), zeros(v)
        q0, q1 = _halves(q)
        dq1, dk, dv = self.blocks.backward(q1, k, v, _halves(o)[1], _halves(stats, axis=2)[1], _halves(d_o)[1],
                                           False)
        return _concat(zeros(q0), dq1), dk, dv

    # --- where a block comes from ------------------------------------------------------------------
    def kind(self, rank, source):
        """The kind of the keys of device `source` for the queries of device `rank` (traced)."""
        return jnp.where(source == rank, _LOCAL, jnp.where(source < rank, _EARLIER, _LATER)).astype(jnp.int32)


def _ring_permutation(n):
    return [(i, (i + 1) % n) for i in range(n)]


def _ring_forward(plan, q, k, v):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    out, kv = _neutral(q), (k, v)
    for t in range(n):  # at step t the keys of device rank - t
        if t < n - 1:  # sent before this step's block runs, so that the transfer can hide behind it
            incoming = jax.lax.ppermute(kv, plan.axis, _ring_permutation(n))
        kind = _LOCAL if t == 0 else plan.kind(rank, (rank - t) % n)
        out = _merge(out, plan.block_forward(q, *kv, kind))
        if t < n - 1:
            kv = incoming
    return out


def _ring_backward(plan, q, k, v, o, stats, d_o):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    d_q = jnp.zeros(q.shape, jnp.float32)
    kv, d_kv = (k, v), (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    for t in range(n):
        if t < n - 1:
            incoming = jax.lax.ppermute(kv, plan.axis, _ring_permutation(n))
        kind = _LOCAL if t == 0 else plan.kind(rank, (rank - t) % n)
        dq_t, dk_t, dv_t = plan.block_backward(q, *kv, o, stats, d_o, kind)
        d_q = d_q + dq_t
        # A block's dK, dV sums travel with it; after the last step one more hop brings them home.
        d_kv = jax.lax.ppermute((d_kv[0] + dk_t, d_kv[1] + dv_t), plan.axis, _ring_permutation(n))
        if t < n - 1:
            kv = incoming
    return d_q, d_kv[0], d_kv[1]


def _gathered(plan, x):
    return jax.lax.all_gather(x, plan.axis, axis=1, tiled=True)


def _all_gather_forward(plan, q, k, v):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    ks, vs = (jnp.split(_gathered(plan, x), n, axis=1) for x in (k, v))
    out = _neutral(q)
    for source in range(n):
        out = _merge(out, plan.block_forward(q, ks[source], vs[source], plan.kind(rank, source)))
    return out


def _all_gather_backward(plan, q, k, v, o, stats, d_o):
    n, rank = jax.lax.axis_size(plan.axis), jax.lax.axis_index(plan.axis)
    ks, vs = (jnp.split(_gathered(plan, x), n, axis=1) for x in (k, v))
    d_q, d_ks, d_vs = jnp.zeros(q.shape, jnp.float32), [], []
    for source in range(n):
        dq_s, dk_s, dv_s = plan.block_backward(q, ks[source], vs[source], o, stats, d_o, plan.kind(rank, source))
        d_q, d_ks, d_vs = d_q + dq_s, d_ks + [dk_s], d_vs + [dv_s]
    scatter = lambda parts: jax.lax.psum_scatter(jnp.concatenate(parts, axis=1), plan.axis, scatter_dimension=1,
                                                 tiled=True)
    return d_q, scatter(d_ks), scatter(d_vs)


_SCHEMES = {"ring": (_ring_forward, _ring_backward), "all_gather": (_all_gather_forward, _all_gather_backward)}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _context_parallel(plan, scheme, q, k, v):
    o, _ = _SCHEMES[scheme][0](plan, q, k, v)
    return o.astype(q.dtype)


def _context_parallel_fwd(plan, scheme, q, k, v):
    o, stats = _SCHEMES[scheme][0](plan, q, k, v)
    o = o.astype(q.dtype)
    return o, (q, k, v, o, stats)


def _context_parallel_bwd(plan, scheme, residuals, d_o):
    q, k, v, o, stats = residuals
    d_q, d_k, d_v = _SCHEMES[scheme][1](plan, q, k, v, o, stats, d_o.astype(o.dtype))
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype)


_context_parallel.defvjp(_context_parallel_fwd, _context_parallel_bwd)


class _PlanKey(_Plan):
    """_Plan, hashable by its settings (custom_vjp's static arguments are compared)."""

    def __init__(self, axis_name, causal, balanced, scale):
        super().__init__(axis_name, causal, balanced, scale)
        self.key = (axis_name, causal, balanced, scale)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _PlanKey) and self.key == other.key


def context_parallel_attention(q, k, v, *, axis_name, causal=False, scheme="ring", load_balanced=True, scale=None):
    """Attention of this device's queries against the keys of every device of mesh axis
    `axis_name`, inside jax.shard_map; q, k, v are this device's parts of the sequence axis, bshd
    (GQA: h_q a multiple of h_kv). scheme: "ring" (each block passed on to the next device) or
    "all_gather". Causal with load_balanced: device r holds chunks r and 2N-1-r (load_balance);
    otherwise chunk r. Differentiable in q, k, v (the module's docstring says how)."""
    if scheme not in _SCHEMES:
        raise invalid_argument("scheme", scheme, '"ring" or "all_gather"')
    if causal and load_balanced and (q.shape[1] % 2 or k.shape[1] % 2):
        raise invalid_argument("q.shape", tuple(q.shape),
                               "an even number of tokens a device with load_balanced causal attention (two chunks)")
    if causal and q.shape[1] != k.shape[1]:
        raise invalid_argument("k.shape", tuple(k.shape), f"as many tokens a device as q ({q.shape[1]}) when causal")
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else float(scale)
    plan = _PlanKey(axis_name, bool(causal), bool(causal and load_balanced), scale)
    return _context_parallel(plan, scheme, q, k, v)
