"""Probe on the GPU: cuDNN's dBias beside a score modifier, and its precision without one.

The learned-tensor tests of score modifiers found the table's gradient wrong beside a softcap
(relative error 0.85) while O, dQ, dK and dV were right, and a learned ALiBi's slopes just outside
bfloat16's tolerance without any modifier. This measures cuDNN's dBias itself, through an explicit
dense bias B (requires grad), against float32 autograd's dL/dB, and against one hypothesis: that
cuDNN reduces dBias after the modifier's derivative (dL/dB * m'(S)) instead of before it.

    PYTHONPATH=build-gpu/python python3 scripts/probe_bias_grad.py
"""
import torch

import fusedattn.torch as fa

CAP = 2.0


def softcap(score, b, h, q_idx, kv_idx):
    return CAP * torch.tanh(score / CAP)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def case(seed, causal, modifier, slopes=False):
    torch.manual_seed(seed)
    b, s_q, s_kv, h, h_kv, d, scale = 2, 256, 320, 8, 2, 64, 0.5
    make = lambda s, heads: (torch.rand(b, s, heads, d, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_()
    q, k, v = make(s_q, h), make(s_kv, h_kv), make(s_kv, h_kv)
    if slopes:  # a learned ALiBi's bias: -slope[h] |q - kv|
        i, j = torch.arange(s_q, device="cuda")[:, None], torch.arange(s_kv, device="cuda")[None, :]
        dense = -(torch.rand(h, device="cuda") * 0.4).view(1, h, 1, 1) * (i - j).abs()
    else:
        dense = torch.rand(1, h, s_q, s_kv, device="cuda") * 0.4
    bias = dense.to(torch.bfloat16).requires_grad_()
    d_o = torch.rand(b, s_q, h, d, device="cuda") * 2 - 1
    o = fa.attention(q, k, v, causal=causal, scale=scale, bias=bias, score_mod=modifier)
    o.backward(d_o.to(o.dtype))

    qf, kf, vf = (t.detach().float().transpose(1, 2) for t in (q, k, v))
    bf = bias.detach().float().requires_grad_()
    scores = qf @ kf.repeat_interleave(h // h_kv, 1).transpose(-1, -2) * scale
    modified = scores if modifier is None else softcap(scores, None, None, None, None)
    logits = modified + bf
    logits.retain_grad()  # dL/dS per batch entry, before the mask (zero where it masks)
    if causal:
        logits = logits.masked_fill(torch.ones(s_q, s_kv, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    ref = (torch.softmax(logits, -1) @ vf.repeat_interleave(h // h_kv, 1)).transpose(1, 2)
    ref.backward(d_o)
    got, want = bias.grad.float(), bf.grad
    line = f"seed {seed} causal {int(causal)} {'softcap' if modifier else 'none':7} {'alibi' if slopes else 'dense'}: " \
           f"O {rel(o, ref):.2e}  dB vs dL/dB {rel(got, want):.2e}"
    if modifier is not None:
        # dL/dB as it would be reduced after the softcap's derivative: sum over b of dL/dS * m'(S)
        after = (logits.grad * (1 - torch.tanh(scores / CAP) ** 2)).sum(0, keepdim=True)
        line += f"  dB vs dL/dB*m'(S) {rel(got, after):.2e}"
    heads = [rel(got[:, x], want[:, x]) for x in range(h)]
    line += "  per head " + " ".join(f"{e:.1e}" for e in heads)
    if slopes:  # the slopes' gradient as the learned test forms it: sum of dB * -|q - kv| per head
        i, j = torch.arange(s_q, device="cuda")[:, None], torch.arange(s_kv, device="cuda")[None, :]
        distance = -(i - j).abs().float()
        line += f"  slopes' gradient {rel((got * distance).sum((0, 2, 3)), (want * distance).sum((0, 2, 3))):.2e}"
    print(line, flush=True)


if __name__ == "__main__":
    print(fa.__name__, torch.__version__, torch.cuda.get_device_name())
    for causal in (False, True):
        for seed in range(2):
            case(seed, causal, softcap)
            case(seed, causal, None)
    for seed in range(4):
        case(seed, False, None, slopes=True)
