"""fusedattn.torch.attention's meaning in float64 on the CPU, for the arguments fusedattn.transformers
passes (bshd or thd; causal, alignment, window, scale, bias, runtime lengths, packed sequences, a
score_mod, sinks), differentiable, so that models run through the integration without a GPU and
their logits and gradients can be compared with transformers' own eager attention. Each call is
recorded (its road) in `calls`."""
import math

import torch

calls = []


def visible(s_q, s_kv, len_q, len_kv, causal, align, window):
    """bool [s_q, s_kv]: the keys each row sees, by the core's rule (src/spec/window_rule.h) over the
    entry's own lengths; nothing for rows and keys past them."""
    left, right = window
    right = 0 if causal else right
    i, j = torch.arange(s_q).view(s_q, 1), torch.arange(s_kv).view(1, s_kv)
    p = i + (len_kv - len_q if align == "bottom_right" else 0)
    keep = (i < len_q) & (j < len_kv)
    if left >= 0:
        keep &= j > p - left
    if right >= 0:
        keep &= j <= p + right
    return keep


def _entry(q, k, v, keep, scale, bias, score_mod, sink):
    """One batch entry in float64: q [s_q, h, d], k, v [s_kv, h_kv, d]; O [s_q, h, d_v] (zero in rows
    that see no key)."""
    h = q.shape[1]
    qd, kd, vd = (x.double().transpose(0, 1) for x in (q, k, v))
    kd, vd = (x.repeat_interleave(h // x.shape[0], 0) for x in (kd, vd))
    scores = (qd @ kd.transpose(-1, -2)) * scale
    if score_mod is not None:
        grids = (torch.zeros(()), torch.arange(h).view(h, 1, 1), torch.arange(scores.shape[1]).view(1, -1, 1),
                 torch.arange(scores.shape[2]).view(1, 1, -1))
        scores = score_mod(scores, *grids)
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~keep, float("-inf"))
    top = scores.amax(-1, keepdim=True).clamp_min(-1e30)
    if sink is not None:
        top = torch.maximum(top, sink.double().view(h, 1, 1))
    weights = torch.exp(scores - top)
    denominator = weights.sum(-1, keepdim=True)
    if sink is not None:
        denominator = denominator + torch.exp(sink.double().view(h, 1, 1) - top)
    out = (weights / denominator.clamp_min(1e-300)) @ vd
    return out.transpose(0, 1)


def attention(q, k, v, *, layout, causal=False, align="top_left", window=(-1, -1), scale=None, bias=None,
              softmax="vanilla", sink=None, dropout_p=0.0, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=0,
              max_seqlen_kv=0, seq_len_q=None, seq_len_kv=None, score_mod=None):
    """The stand-in: O in q's layout and dtype."""
    assert dropout_p == 0.0, "the stand-in draws no dropout"
    assert (softmax == "sink") == (sink is not None)
    calls.append(dict(layout=layout, causal=causal, align=align, window=tuple(window), bias=bias is not None,
                      lengths=seq_len_q is not None, softcap=score_mod is not None, sink=sink is not None,
                      shapes=(tuple(q.shape), tuple(k.shape))))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if layout == "thd":
        assert max_seqlen_q >= int(cu_seqlens_q.diff().max()) and max_seqlen_kv >= int(cu_seqlens_kv.diff().max())
        outs = []
        for (q0, q1), (k0, k1) in zip(zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:]),
                                      zip(cu_seqlens_kv.tolist(), cu_seqlens_kv.tolist()[1:])):
            keep = visible(q1 - q0, k1 - k0, q1 - q0, k1 - k0, causal, align, tuple(window))
            outs.append(_entry(q[q0:q1], k[k0:k1], v[k0:k1], keep, scale, None, score_mod, sink))
        out = torch.cat(outs)
        return torch.cat([out, out.new_zeros(q.shape[0] - out.shape[0], *out.shape[1:])]).to(q.dtype)
    assert layout == "bshd"
    b, s_q, s_kv = q.shape[0], q.shape[1], k.shape[1]
    outs = []
    for entry in range(b):
        len_q = int(seq_len_q[entry]) if seq_len_q is not None else s_q
        len_kv = int(seq_len_kv[entry]) if seq_len_kv is not None else s_kv
        keep = visible(s_q, s_kv, len_q, len_kv, causal, align, tuple(window))
        entry_bias = None if bias is None else bias[entry if bias.shape[0] > 1 else 0]
        outs.append(_entry(q[entry], k[entry], v[entry], keep, scale, entry_bias, score_mod, sink))
    return torch.stack(outs).to(q.dtype)
