"""fusedattn.torch's other paths without a GPU: the C++ fast path declines CPU tensors and maps its
errors as the rest of the adapter does, and the PyTorch fallback applies the core's window rule."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")


def test_the_cpp_fast_path_maps_errors_like_the_rest():
    fast = pytest.importorskip("fusedattn._torch_ops", reason="built only where PyTorch with CUDA is installed")
    import fusedattn
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    config_id = fa._plain_config_id("bshd", False, (-1, -1), "top_left", False, "vanilla", False)
    assert fa._plain_config_id("bshd", False, (-1, -1), "top_left", False, "vanilla", False) == config_id >= 0
    assert fast.forward(q, q, q, config_id, 0.125) is NotImplemented  # not on a GPU: the general path says why
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fa.attention(q, q, q)
    assert caught.value.field == "q.device" and caught.value.requirement == "a CUDA device"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fast.forward(q, "k", q, config_id, 0.125)
    assert caught.value.field == "k" and caught.value.requirement == "a torch.Tensor"
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fast.forward(q, q, q, 1 << 20, 0.125)
    assert caught.value.field == "config_id"


@pytest.mark.parametrize("left, right, align, with_bias", [
    (-1, 0, "top_left", False), (-1, 0, "top_left", True), (-1, 0, "bottom_right", False),
    (16, 0, "bottom_right", True), (8, 4, "top_left", False), (-1, -1, "top_left", True)])
def test_the_fallback_applies_the_cores_window_rule(left, right, align, with_bias):
    """On the CPU: PyTorch's attention as the fallback runs it, against scores masked by the rule
    the core documents (diagonal p; keys p - left < j <= p + right visible)."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 40, 4, 16), torch.randn(2, 56, 2, 16), torch.randn(2, 56, 2, 16)
    bias = torch.randn(2, 4, 40, 56) if with_bias else None
    out = fa._fallback.run(q, k, v, layout="bshd", window=(left, right), align=align, scale=0.25, bias=bias,
                           dropout_p=0.0)
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    kb, vb = kb.repeat_interleave(2, 1), vb.repeat_interleave(2, 1)
    scores = qb @ kb.transpose(-1, -2) * 0.25 + (bias if with_bias else 0)
    shift = 56 - 40 if align == "bottom_right" else 0
    for i in range(40):
        for j in range(56):
            p = i + shift
            if (left >= 0 and j <= p - left) or (right >= 0 and j > p + right):
                scores[:, :, i, j] = float("-inf")
    expected = (torch.softmax(scores, -1) @ vb).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-5)
