"""fusedattn.torch's fallback: PyTorch's own attention for a configuration fusedattn does not support,
computed with the core's mask rule, and its reason logged once per configuration."""
import logging

import torch

from .. import _config

_LOG = logging.getLogger("fusedattn")

LOGGED = set()  # the configurations whose fallback was logged (capped: a log line, not a cache)


def log_once(config_text, q, k, error):
    key = (config_text, q.dtype, tuple(q.shape), tuple(k.shape))
    if key not in LOGGED and len(LOGGED) < 4096:
        LOGGED.add(key)
        _LOG.warning("fusedattn: falling back to torch.nn.functional.scaled_dot_product_attention: %s", error)


def run(q, k, v, *, layout, window, align, scale, bias, dropout_p):
    """PyTorch's own attention on [b, h, s, d] views, the result back in q's layout. The window
    (left, right; -1 open) is the core's: with the diagonal at p (row i, shifted by s_kv - s_q when
    bottom-right), keys p - left < j <= p + right are visible."""
    left, right = window
    to_bhsd = _config.AXES[layout]
    qb, kb, vb = (t.permute(*to_bhsd) for t in (q, k, v))
    mask = bias
    # SDPA's own is_causal is top-left causal without a mask; anything else becomes the mask.
    causal = bias is None and left < 0 and right == 0 and align == "top_left"
    if (left >= 0 or right >= 0) and not causal:
        s_q, s_kv = qb.shape[2], kb.shape[2]
        p = torch.arange(s_q, device=q.device)[:, None] + (s_kv - s_q if align == "bottom_right" else 0)
        j = torch.arange(s_kv, device=q.device)[None, :]
        keep = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device)
        if left >= 0:
            keep &= j > p - left
        if right >= 0:
            keep &= j <= p + right
        mask = keep if bias is None else bias.masked_fill(~keep, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(
        qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale,
        enable_gqa=qb.shape[1] != kb.shape[1])
    back = [0, 0, 0, 0]
    for logical, axis in enumerate(to_bhsd):
        back[axis] = logical
    return out.permute(*back)
