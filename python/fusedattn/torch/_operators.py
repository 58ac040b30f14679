"""Roads 2 and 3 of fusedattn.torch's docstring around the operator bodies (_bodies.py): eager calls
run the bodies directly, inside an autograd.Function when a gradient is needed (the dispatcher
costs more than the rest); compiled code, meta tensors, tensor subclasses and dispatch modes go
through the registered operators fusedattn::forward / fusedattn::backward, whose fake
implementations give torch.compile the shapes without a graph break."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _config
from ._bodies import backward_body, forward_body
from ._call_config import call_spec
from ._tensors import EMPTY, Extras


def eager_road(*tensors):
    """Road 2 (the bodies directly): plain CUDA tensors (the first one's device decides), outside
    compiled code and dispatch modes. Otherwise road 3, the operators."""
    plain_tensors = all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)
    return (not torch.compiler.is_compiling() and tensors[0].device.type == "cuda" and plain_tensors
            and not torch._C._len_torch_dispatch_stack())


def attend(q, k, v, *, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv, needs_grad):
    """(O, statistics, max logit) by road 2 or 3. `extras`: an Extras; `config`: the printed config."""
    if not eager_road(q, k, v):
        return _forward_op(q, k, v, bias, sink, extras.as_list(), config, scale, max_seqlen_q, max_seqlen_kv)
    if needs_grad:
        return _EagerAttention.apply(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv)
    return forward_body(q, k, v, bias=bias, sink=sink, extras=extras, config=config, scale=scale,
                        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)


def plain_backward(d_o, q, k, v, o, stats, *, config, scale, seq_len_q=None, seq_len_kv=None):
    """dQ, dK, dV of a call without bias, sink or dropout (its runtime lengths where it has them),
    through fusedattn::backward (fp8_attention's backward="model" in compiled code)."""
    extras = Extras(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv).as_list()
    d_q, d_k, d_v, _, _ = _backward_op(d_o, q, k, v, o, stats, None, None, extras, config, scale, 0, 0)
    return d_q, d_k, d_v


class _EagerAttention(torch.autograd.Function):
    """Eager training with the operator bodies, without the dispatcher's per-call cost."""

    @staticmethod
    def forward(ctx, q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
        o, stats, max_logit = forward_body(q, k, v, bias=bias, sink=sink, extras=extras, config=config, scale=scale,
                                           max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
        ctx.save_for_backward(q, k, v, o, stats, bias, sink, *extras.as_list())  # rng: the forward's mask
        ctx.call = dict(config=config, scale=scale, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
        if max_logit is not None:
            ctx.mark_non_differentiable(max_logit)
        ctx.mark_non_differentiable(stats)
        return o, stats, max_logit

    @staticmethod
    def backward(ctx, d_o, _d_stats, _d_max_logit):
        q, k, v, o, stats, bias, sink, *extras = ctx.saved_tensors
        d_q, d_k, d_v, d_bias, d_sink = backward_body(d_o, q, k, v, o, stats, bias=bias, sink=sink,
                                                      extras=Extras.of(extras), **ctx.call)
        return d_q, d_k, d_v, d_bias, d_sink, None, None, None, None, None


# --- the registered operators (compiled code, meta tensors, subclasses, dispatch modes) ----------

@torch.library.custom_op("fusedattn::forward", mutates_args=())
def _forward_op(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], sink: Optional[Tensor],
                extras: List[Optional[Tensor]], config: str, scale: float, max_seqlen_q: int,
                max_seqlen_kv: int) -> Tuple[Tensor, Tensor, Tensor]:
    """`config` is the core Config's printed form: compiled programs may outlive this process."""
    o, stats, max_logit = forward_body(q, k, v, bias=bias, sink=sink, extras=Extras.of(extras), config=config,
                                       scale=scale, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
    return o, _or_empty(stats, q), _or_empty(max_logit, q)


def _check_while_tracing(q, k, v, bias, extras, config, max_seqlen_q, max_seqlen_kv):
    """Tracing (torch.compile, meta tensors) meets bad input as eager calls do: the core builds the
    spec from the fake tensors' sizes, where they are plain numbers (not symbolic)."""
    tensors = [t for t in (q, k, v, bias, *extras) if t is not None]
    if all(isinstance(n, int) for t in tensors for n in (*t.shape, *t.stride())):
        call_spec(q, k, v, bias=bias, extras=Extras.of(extras), config=config, max_seqlen_q=max_seqlen_q,
                  max_seqlen_kv=max_seqlen_kv)


@_forward_op.register_fake
def _(q, k, v, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    _check_while_tracing(q, k, v, bias, extras, config, max_seqlen_q, max_seqlen_kv)
    shapes = _config.output_shapes(_config.parse(config), _config.FORWARD, q, k, v)
    stats = q.new_empty(shapes.get("stats", EMPTY), dtype=torch.float32)
    return q.new_empty(shapes["o"]), stats, q.new_empty(shapes.get("max_logit", EMPTY), dtype=torch.float32)


@torch.library.custom_op("fusedattn::backward", mutates_args=())
def _backward_op(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, stats: Tensor, bias: Optional[Tensor],
                 sink: Optional[Tensor], extras: List[Optional[Tensor]], config: str, scale: float,
                 max_seqlen_q: int, max_seqlen_kv: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    d_q, d_k, d_v, d_bias, d_sink = backward_body(d_o, q, k, v, o, stats, bias=bias, sink=sink,
                                                  extras=Extras.of(extras), config=config, scale=scale,
                                                  max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
    return d_q, d_k, d_v, _or_empty(d_bias, q), _or_empty(d_sink, q, torch.float32)


@_backward_op.register_fake
def _(d_o, q, k, v, o, stats, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    grads = tuple(torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
    d_bias = torch.empty_like(bias) if _config.parse(config).bias_grad else q.new_empty(EMPTY)
    d_sink = torch.empty_like(sink) if sink is not None else q.new_empty(EMPTY, dtype=torch.float32)
    return grads + (d_bias, d_sink)


def _or_empty(t, like, dtype=torch.float32):
    return like.new_empty(EMPTY, dtype=dtype) if t is None else t


def _setup_context(ctx, inputs, output):
    q, k, v, bias, sink, extras, config, scale, max_q, max_kv = inputs
    o, stats, _ = output
    ctx.save_for_backward(q, k, v, o, stats, bias, sink, *extras)
    ctx.call = (config, scale, max_q, max_kv)


def _operator_gradients(ctx, d_o, _d_stats, _d_max_logit):
    q, k, v, o, stats, bias, sink, *extras = ctx.saved_tensors
    config = ctx.call[0]
    d_q, d_k, d_v, d_bias, d_sink = _backward_op(d_o, q, k, v, o, stats, bias, sink, extras, *ctx.call)
    return (d_q, d_k, d_v, d_bias if _config.parse(config).bias_grad else None,
            d_sink if sink is not None else None, None, None, None, None, None)


torch.library.register_autograd("fusedattn::forward", _operator_gradients, setup_context=_setup_context)
