"""The PyTorch GPU tests' reference: float32 math attention of upcast inputs on [b, h, s, d] views
(GQA, causal either alignment, a bias, a sink), the relative error the tests measure, and random
inputs in each layout."""
import torch

TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(q, k, v, layout, causal=False, align="top_left", bias=None, sink=None):
    """float32 math attention on [b, h, s, d] views; a sink adds e^sink[h] to each row's denominator."""
    qb, kb, vb = (t.detach().float().permute(*TO_BHSD[layout]).requires_grad_() for t in (q, k, v))
    s_q, s_kv = qb.shape[2], kb.shape[2]
    groups = qb.shape[1] // kb.shape[1]
    ke, ve = kb.repeat_interleave(groups, 1), vb.repeat_interleave(groups, 1)
    scores = qb @ ke.transpose(-1, -2) / qb.shape[-1] ** 0.5
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        shift = s_kv - s_q if align == "bottom_right" else 0
        keep = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).tril(shift)
        scores = scores.masked_fill(~keep, float("-inf"))
    if sink is not None:
        extra = sink.detach().float().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat([scores, extra], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    out = probs @ ve
    back = [0] * 4
    for logical, axis in enumerate(TO_BHSD[layout]):
        back[axis] = logical
    return out.permute(*back), (qb, kb, vb)


def inputs(layout, b, s_q, s_kv, h_q, h_kv, d, dtype=torch.bfloat16):
    def make(s, h):
        shape = {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]
        return (torch.rand(shape, device="cuda", dtype=dtype) * 2 - 1).requires_grad_()
    return make(s_q, h_q), make(s_kv, h_kv), make(s_kv, h_kv)
