"""The operator bodies: one forward and one backward of the core's plans on CUDA tensors, with the
outputs allocated by PyTorch's caching allocator and the work enqueued on the current stream. Eager
calls run them directly and the registered operators (_operators.py) run them too; so do the block
kernels of context parallelism and fp8_attention's backward="model". Also the device rules that the
core cannot check, since it sees addresses and not devices."""
import contextlib

import torch

from .. import _config
from .. import _core as core
from ..errors import invalid_argument
from ._call_config import call_spec
from ._tensors import address, view

_SAME_DEVICE = contextlib.nullcontext()


def require_one_cuda_device(q, k, v, **arrays):
    """The core sees addresses, not devices: the tensors must share one GPU (or meta, for tracing).
    `arrays`: more tensors by name (None where absent), such as a paged call's tables."""
    if q.device.type not in ("cuda", "meta"):
        raise invalid_argument("q.device", q.device, "a CUDA device")
    for name, t in (("k", k), ("v", v), *arrays.items()):
        if t is not None and t.device != q.device:
            raise invalid_argument(f"{name}.device", t.device, f"q's device, {q.device}")


def on_device(device):
    """Plans run on the device they were built for: make the tensors' device current if it is not."""
    return _SAME_DEVICE if device.index == torch._C._cuda_getDevice() else torch.cuda.device(device)


def run(plan, tensors, scale, device):
    """Enqueues `plan` on the device's current stream with scratch memory from PyTorch's caching
    allocator (held until the work is enqueued)."""
    size = plan.workspace_bytes
    workspace = torch.empty(size, dtype=torch.uint8, device=device) if size else None
    plan.run(tensors, scale, torch._C._cuda_getCurrentRawStream(device.index), address(workspace), size)


def forward_body(q, k, v, *, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    """O, the statistics and the max logit (None where the config asks for none). `config`: the
    call's printed config (_call_config.config_text); `extras`: an Extras."""
    parsed, spec = call_spec(q, k, v, bias=bias, extras=extras, config=config, max_seqlen_q=max_seqlen_q,
                             max_seqlen_kv=max_seqlen_kv)
    with on_device(q.device):
        shapes = _config.output_shapes(parsed, _config.FORWARD, q, k, v)
        o = q.new_empty(shapes["o"])
        stats = q.new_empty(shapes["stats"], dtype=torch.float32) if spec.stats else None
        max_logit = q.new_empty(shapes["max_logit"], dtype=torch.float32) if "max_logit" in shapes else None
        tensors = core.ForwardTensors(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                                      stats=address(stats), max_logit=address(max_logit), bias=address(bias),
                                      sink=address(sink), page_table_k=address(extras.page_table_k),
                                      page_table_v=address(extras.page_table_v), **extras.addresses())
        run(core.get_plan(spec, _config.FORWARD), tensors, scale, q.device)
    return o, stats, max_logit


def backward_body(d_o, q, k, v, o, stats, *, bias, sink, extras, config, scale, max_seqlen_q, max_seqlen_kv):
    """dQ, dK, dV (with their inputs' strides: a view of a packed buffer gets a packed-strided
    gradient), dBias where the config asks for it, dSink with a sink (else None)."""
    parsed, spec = call_spec(q, k, v, bias=bias, extras=extras, config=config, max_seqlen_q=max_seqlen_q,
                             max_seqlen_kv=max_seqlen_kv)
    with on_device(q.device):
        d_q, d_k, d_v = (torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
        d_bias = torch.empty_like(bias) if parsed.bias_grad else None
        d_sink = torch.empty_like(sink) if sink is not None else None
        d_o = d_o.contiguous()  # O's own layout, which the plan was built for
        tensors = core.BackwardTensors(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                                       d_o=d_o.data_ptr(), stats=stats.data_ptr(), d_q=d_q.data_ptr(),
                                       d_k=d_k.data_ptr(), d_v=d_v.data_ptr(), bias=address(bias), sink=address(sink),
                                       d_bias=address(d_bias), d_sink=address(d_sink), **extras.addresses())
        run(core.get_plan(spec, _config.BACKWARD), tensors, scale, q.device)
    return d_q, d_k, d_v, d_bias, d_sink
