"""A learnable sink in a decode step (fusedattn/torch/_sink_decode.py) without a GPU: the vanilla
call's O and log-sum-exp joined with the sink equal attention with the sink in the denominator
(float64, every dense layout, rows that see no key), and attention() takes that road exactly for
one query row without gradients, on meta tensors as on a GPU."""
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn.torch import _sink_decode  # noqa: E402

B, H, S_KV, D = 3, 4, 37, 16


def attention_bhsd(q, k, v, keep, sink=None):
    """float64 attention of [b, h, s, d] q, k, v (scale 1/sqrt(d)), with `sink` [h] in each row's
    denominator when given; O and the log-sum-exp over the keys (and the sink)."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep, float("-inf"))
    if sink is not None:
        scores = torch.cat([scores, sink.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)], -1)
        v = torch.cat([v, torch.zeros_like(v[:, :, :1])], 2)
    lse = torch.logsumexp(scores, -1)
    weights = torch.where(torch.isfinite(lse)[..., None], torch.exp(scores - lse[..., None]), 0.0)
    return weights @ v, lse


def to_layout(x, layout):
    return x.transpose(1, 2) if layout == "bshd" else x.permute(2, 0, 1, 3) if layout == "sbhd" else x


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_the_vanilla_call_joined_with_the_sink_is_attention_with_the_sink(layout):
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.rand(B, H, n, D, generator=generator, dtype=torch.float64) * 2 - 1 for n in (1, S_KV, S_KV))
    sink = torch.randn(H, generator=generator, dtype=torch.float64) * 2
    keep = torch.ones(B, 1, 1, S_KV, dtype=torch.bool)
    keep[1, ..., 20:] = False
    keep[2] = False  # a sequence whose row sees no key: O 0, the log-sum-exp the sink's
    o, lse = attention_bhsd(q, k, v, keep)
    want_o, want_lse = attention_bhsd(q, k, v, keep, sink)
    got_o, got_lse = _sink_decode.join_sink(to_layout(o, layout), lse, sink, layout)
    assert torch.allclose(got_o, to_layout(want_o, layout), atol=1e-12, rtol=0)
    assert torch.allclose(got_lse, want_lse, atol=1e-12, rtol=0)
    assert torch.equal(got_lse[2], sink.view(H, 1)) and not got_o.isnan().any()


def meta(*shape, grad=False):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16).requires_grad_(grad)


def test_attention_takes_the_road_for_one_query_row_without_gradients(monkeypatch):
    taken = []
    real = _sink_decode.run

    def recording(*args, **options):
        taken.append(options["layout"])
        return real(*args, **options)
    monkeypatch.setattr(_sink_decode, "run", recording)
    sink = torch.zeros(8, device="meta")
    k = meta(2, 100, 2, 64)
    o = fa.attention(meta(2, 1, 8, 64), k, k, softmax="sink", sink=sink, causal=True, align="bottom_right")
    assert taken == ["bshd"] and o.shape == (2, 1, 8, 64) and o.dtype == torch.bfloat16
    o, stats = fa.attention(meta(2, 8, 1, 64), meta(2, 2, 100, 64), meta(2, 2, 100, 64), layout="bhsd",
                            softmax="sink", sink=sink, return_stats=True)
    assert taken == ["bshd", "bhsd"] and o.shape == (2, 8, 1, 64) and stats.shape == (2, 8, 1)
    # Two query rows, a gradient, or the max logit: the one call, as before.
    fa.attention(meta(2, 2, 8, 64), k, k, softmax="sink", sink=sink)
    fa.attention(meta(2, 1, 8, 64, grad=True), k, k, softmax="sink", sink=sink)
    fa.attention(meta(2, 1, 8, 64), k, k, softmax="sink", sink=sink, return_max_logit="row")
    assert taken == ["bshd", "bhsd"]
