"""fp8_attention's operator bodies around cuDNN's FP8 kernels (fusedattn/fp8_scales.h), eager and
compiled calls alike: each takes the state as one Scaling (its buffer and options, _fp8_state.py),
which finds its slots and runs the recipe's quantizations and updates; _fp8_operators.py runs the
bodies by road 2 or 3. Where each scale comes from is _fp8.py's docstring. A forward with inputs in
model precision is four launches besides cuDNN's (quantize Q, K and V; the scale updates; O's
dequantization; and, current scaling, the amaxes first); a backward, three or four (dO's
quantization, the gradients' dequantization, the updates)."""
import torch

from .. import _config
from .. import _core as core
from .. import _fp8_recipe as _recipe
from ._bodies import backward_body, on_device, run
from ._fp8_state import dequantized, dequantized_many
from ._tensors import Extras, view


def _kernel_forward(scaling, config, q8, k8, v8, descales, scale, seq_len_q, seq_len_kv):
    """cuDNN's FP8 forward of q8, k8, v8 with their descales (device addresses): (o8, the statistics).
    O's scale must be set in the state first; the kernel writes the amaxes of S and O there. With
    runtime lengths (the config's padding), O is zero past each sequence's queries."""
    spec = config.spec(view(q8), view(k8), view(v8), 0, 0, 0)
    lengths = Extras(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    lengths.check_lengths_and_tables(spec)
    with on_device(q8.device):
        shapes = _config.output_shapes(config, _config.FORWARD, q8, k8, v8)
        o8 = torch.empty(shapes["o"], dtype=scaling.dtype, device=q8.device)
        stats = torch.empty(shapes["stats"], dtype=torch.float32, device=q8.device)
        descale_q, descale_k, descale_v = descales
        scales = scaling.slot_addresses(_config.FORWARD, descale_q=descale_q, descale_k=descale_k,
                                        descale_v=descale_v)
        tensors = core.ForwardTensors(q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=o8.data_ptr(),
                                      stats=stats.data_ptr(), **lengths.addresses(), **scales)
        run(core.get_plan(spec, _config.FORWARD), tensors, scale, q8.device)
    return o8, stats


def forward(q, k, v, *, scaling, config, scale, seq_len_q=None, seq_len_kv=None):
    """O in q's dtype, the FP8 tensors the backward takes (q8, k8, v8, o8), the statistics and the
    descales of Q, K, V and O this call used. Updates the state. The lengths: int32 [b] each, with a
    config of runtime lengths (the amaxes are the whole tensors', padding rows included)."""
    parsed = _config.parse(config)
    with on_device(q.device):
        q8, k8, v8, used = scaling.quantize_inputs(q, k, v)
        o8, stats = _kernel_forward(scaling, parsed, q8, k8, v8, [used[i].data_ptr() for i in range(3)], scale,
                                    seq_len_q, seq_len_kv)
        o = dequantized(o8, used[3].data_ptr(), q.dtype)
    return o, q8, k8, v8, o8, stats, used


def fp8_inputs_forward(q8, k8, v8, descale_q, descale_k, descale_v, *, scaling, config, scale, out_dtype,
                       seq_len_q=None, seq_len_kv=None):
    """Inputs already in FP8, with their descales (float32 one-element tensors): (o8, O in out_dtype,
    the statistics, the descales of Q, K, V and O [4]); O in out_dtype is empty where out_dtype is
    the state's FP8 dtype (o8 is that O). O's scale comes from V's amax, measured here (max |V|
    bounds |O|). Updates the state's slots of V (its amax) and O; Q's, K's and V's scales are the
    caller's."""
    parsed = _config.parse(config)
    with on_device(q8.device):
        core.measure_amax(view(v8), v8.data_ptr(), scaling.amax("v"), scaling.stream())  # of the stored values
        scaling.scalars[_recipe.SLOT["v"], 2].mul_(descale_v.reshape(()))
        used = torch.cat([d.reshape(1) for d in (descale_q, descale_k, descale_v)] + [descale_q.new_empty(1)])
        scaling.update((_recipe.Update("from_amax", "o", source="v"), _recipe.Update("keep", "o", used=3)), used)
        o8, stats = _kernel_forward(scaling, parsed, q8, k8, v8, [used[i].data_ptr() for i in range(3)], scale,
                                    seq_len_q, seq_len_kv)
        o = o8.new_empty(0) if out_dtype == scaling.dtype else dequantized(o8, used[3].data_ptr(), out_dtype)
    return o8, o, stats, used


def backward(d_o, q8, k8, v8, o8, stats, used, like, *, scaling, config, scale, calibrated, seq_len_q=None,
             seq_len_kv=None):
    """dQ, dK, dV in like's dtype from cuDNN's FP8 backward, with the descales `used` of the forward
    that made q8, k8, v8, o8. Not `calibrated`: the backward runs twice, the first run to measure the
    kernel-written tensors' amaxes. Updates the state. The forward's lengths, where it had them: the
    gradients are zero past them."""
    parsed = _config.parse(config)
    descale_q, descale_k, descale_v, descale_o = (used[i].data_ptr() for i in range(4))
    spec = parsed.spec(view(q8), view(k8), view(v8), 0, 0, 0)
    with on_device(q8.device):
        d_o8 = scaling.quantize_gradient(d_o.contiguous())
        grads8 = [torch.empty_strided(t.size(), t.stride(), dtype=scaling.grad_dtype, device=t.device)
                  for t in (q8, k8, v8)]
        tensors = core.BackwardTensors(
            q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=o8.data_ptr(), d_o=d_o8.data_ptr(),
            stats=stats.data_ptr(), d_q=grads8[0].data_ptr(), d_k=grads8[1].data_ptr(), d_v=grads8[2].data_ptr(),
            **Extras(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv).addresses(),
            **scaling.slot_addresses(_config.BACKWARD, descale_q=descale_q, descale_k=descale_k, descale_v=descale_v,
                                     descale_o=descale_o))
        plan = core.get_plan(spec, _config.BACKWARD)
        # A state's first backward measures the kernel-written tensors' amaxes, then runs again
        # with scales from them. The gradients are dequantized with the descales their run used,
        # before the step moves the scales on.
        for again in range(1 if calibrated else 2):
            if again:
                scaling.update(_recipe.delayed_updates(_recipe.KERNEL_WRITTEN))
            run(plan, tensors, scale, q8.device)
        grads = dequantized_many([(g8, scaling.descale(n)) for g8, n in zip(grads8, ("d_q", "d_k", "d_v"))],
                                 like.dtype)
        scaling.update(_recipe.delayed_updates(_recipe.moved_after_backward(scaling.options.recipe)))
    return grads[0], grads[1], grads[2]


def model_backward(d_o, q, k, v, o, stats, *, config, scale, seq_len_q=None, seq_len_kv=None):
    """backward="model": fusedattn's BF16/FP16 backward on the unquantized inputs (the config's spec
    on these is the model-precision one), with the forward's lengths where it had them."""
    extras = Extras(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    d_q, d_k, d_v, _, _ = backward_body(d_o, q, k, v, o, stats, bias=None, sink=None, extras=extras, config=config,
                                        scale=scale, max_seqlen_q=0, max_seqlen_kv=0)
    return d_q, d_k, d_v
