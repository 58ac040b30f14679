"""fp8_attention's operator bodies around cuDNN's FP8 kernels (fusedattn/fp8_scales.h), eager and
compiled calls alike: each takes the state as its buffer and options (recipe, margin, the format's
name) and finds its slots in it (_fp8_state.Scaling); _fp8_operators.py runs them by road 2 or 3.
Where each scale comes from is _fp8.py's docstring."""
import torch

from .. import _config
from .. import _core as core
from .. import _fp8_recipe as _recipe
from ._bodies import backward_body, on_device, run
from ._fp8_state import Scaling, dequantized
from ._tensors import Extras, view


def _kernel_forward(state, config, q8, k8, v8, descales, scale):
    """cuDNN's FP8 forward of q8, k8, v8 with their descales (device addresses): (o8, the statistics).
    O's scale is set from V's amax in the state first (|O| <= max |V|); the kernel writes the amaxes
    of S and O there."""
    state.set_from_amax("o", source="v")
    spec = config.spec(view(q8), view(k8), view(v8), 0, 0, 0)
    with on_device(q8.device):
        shapes = _config.output_shapes(config, _config.FORWARD, q8, k8, v8)
        o8 = torch.empty(shapes["o"], dtype=state.dtype, device=q8.device)
        stats = torch.empty(shapes["stats"], dtype=torch.float32, device=q8.device)
        descale_q, descale_k, descale_v = descales
        scales = state.slot_addresses(_config.FORWARD, descale_q=descale_q, descale_k=descale_k, descale_v=descale_v)
        tensors = core.ForwardTensors(q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=o8.data_ptr(),
                                      stats=stats.data_ptr(), **scales)
        run(core.get_plan(spec, _config.FORWARD), tensors, scale, q8.device)
    return o8, stats


def forward(q, k, v, *, buffer, config, scale, recipe, margin, name):
    """O in q's dtype, the FP8 tensors the backward takes (q8, k8, v8, o8), the statistics and the
    descales of Q, K, V and O this call used. Updates the state in `buffer`."""
    state, parsed = Scaling(buffer, recipe=recipe, margin=margin, name=name), _config.parse(config)
    q8, k8, v8 = state.quantize("q", q), state.quantize("k", k), state.quantize("v", v)
    o8, stats = _kernel_forward(state, parsed, q8, k8, v8, [state.descale(n) for n in "qkv"], scale)
    with on_device(q.device):
        o = dequantized(o8, state.descale("o"), q.dtype)
        used = state.used_descales()
    if state.recipe == "delayed":
        state.advance(("q", "k", "v"))
    return o, q8, k8, v8, o8, stats, used


def fp8_inputs_forward(q8, k8, v8, descale_q, descale_k, descale_v, *, buffer, config, scale, recipe, margin, name,
                       out_dtype):
    """Inputs already in FP8, with their descales (float32 one-element tensors): (o8, O in out_dtype,
    the statistics, the descales of Q, K, V and O [4]); O in out_dtype is empty where out_dtype is
    the state's FP8 dtype (o8 is that O). O's scale comes from V's amax, measured here (max |V|
    bounds |O|). Updates the state's slots of V (its amax) and O in `buffer`; Q's, K's and V's scales
    are the caller's."""
    state, parsed = Scaling(buffer, recipe=recipe, margin=margin, name=name), _config.parse(config)
    core.measure_amax(view(v8), v8.data_ptr(), state.amax("v"), state.stream())  # of the stored values
    state.scalars[_recipe.SLOT["v"], 2].mul_(descale_v.reshape(()))
    descales = (descale_q, descale_k, descale_v)
    o8, stats = _kernel_forward(state, parsed, q8, k8, v8, [d.data_ptr() for d in descales], scale)
    with on_device(q8.device):
        used = torch.cat([d.reshape(1) for d in descales] + [state.scalars[_recipe.SLOT["o"], 1:2]])
        o = o8.new_empty(0) if out_dtype == state.dtype else dequantized(o8, state.descale("o"), out_dtype)
    return o8, o, stats, used


def backward(d_o, q8, k8, v8, o8, stats, used, like, *, buffer, config, scale, recipe, margin, name, calibrated):
    """dQ, dK, dV in like's dtype from cuDNN's FP8 backward, with the descales `used` of the forward
    that made q8, k8, v8, o8. Not `calibrated`: the backward runs twice, the first run to measure the
    kernel-written tensors' amaxes. Updates the state in `buffer`."""
    state, parsed = Scaling(buffer, recipe=recipe, margin=margin, name=name), _config.parse(config)
    descale_q, descale_k, descale_v, descale_o = (used[i].data_ptr() for i in range(4))
    d_o8 = state.quantize("d_o", d_o.contiguous())
    spec = parsed.spec(view(q8), view(k8), view(v8), 0, 0, 0)
    with on_device(q8.device):
        grads8 = [torch.empty_strided(t.size(), t.stride(), dtype=state.grad_dtype, device=t.device)
                  for t in (q8, k8, v8)]
        tensors = core.BackwardTensors(
            q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=o8.data_ptr(), d_o=d_o8.data_ptr(),
            stats=stats.data_ptr(), d_q=grads8[0].data_ptr(), d_k=grads8[1].data_ptr(), d_v=grads8[2].data_ptr(),
            **state.slot_addresses(_config.BACKWARD, descale_q=descale_q, descale_k=descale_k, descale_v=descale_v,
                                   descale_o=descale_o))
        plan = core.get_plan(spec, _config.BACKWARD)
        # A state's first backward measures the kernel-written tensors' amaxes, then runs again
        # with scales from them. The gradients are dequantized with the descales their run used,
        # before the step moves the scales on.
        for again in range(1 if calibrated else 2):
            if again:
                state.advance(_recipe.KERNEL_WRITTEN)
            run(plan, tensors, scale, q8.device)
        grads = [dequantized(g8, state.descale(n), like.dtype) for g8, n in zip(grads8, ("d_q", "d_k", "d_v"))]
        state.advance(_recipe.moved_after_backward(state.recipe))
    return grads[0], grads[1], grads[2]


def model_backward(d_o, q, k, v, o, stats, *, config, scale):
    """backward="model": fusedattn's BF16/FP16 backward on the unquantized inputs (the config's spec
    on these is the model-precision one)."""
    d_q, d_k, d_v, _, _ = backward_body(d_o, q, k, v, o, stats, bias=None, sink=None, extras=Extras(), config=config,
                                        scale=scale, max_seqlen_q=0, max_seqlen_kv=0)
    return d_q, d_k, d_v
