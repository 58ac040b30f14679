"""fusedattn.torch without a GPU: what the adapter hands the core, the spec its tensors translate to
(layouts named, packed views, ragged and paged batches), built on meta tensors."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
fa = pytest.importorskip("fusedattn.torch")

from fusedattn.torch import _tensors  # noqa: E402
from meta_tensors import meta  # noqa: E402


# What the adapter hands the core: the spec its tensors translate to (no GPU needed to build it).
def spec_of(q, k, v, layout, kv_layout="", sequences=0, max_q=0, max_kv=0, **options):
    from fusedattn import _config
    config = _config.config(layout, kv_layout, stats=False, **options)
    return str(config.spec(_tensors.view(q), _tensors.view(k), _tensors.view(v), sequences, max_q, max_kv))


@pytest.mark.parametrize("layout, q_shape, kv_shape", [
    ("bshd", (2, 100, 8, 64), (2, 150, 2, 64)),
    ("sbhd", (100, 2, 8, 64), (150, 2, 2, 64)),
    ("bhsd", (2, 8, 100, 64), (2, 2, 150, 64)),
])
def test_tensors_translate_to_the_named_layout(layout, q_shape, kv_shape):
    q, k, v = meta(*q_shape, grad=False), meta(*kv_shape, grad=False), meta(*kv_shape, grad=False)
    assert spec_of(q, k, v, layout) == (f"layout={layout} dtype=bf16 b=2 s_q=100 s_kv=150 h_q=8 h_kv=2 d_qk=64 "
                                        "d_v=64 stats=0")


def test_packed_views_translate_to_packed_layouts():
    qkv = meta(2, 64, 3, 4, 32, grad=False)
    assert spec_of(*qkv.unbind(2), "bshd").startswith("layout=bs3hd dtype=bf16 b=2 s_q=64 s_kv=64 h_q=4 h_kv=4")
    q, kv = meta(2, 64, 4, 32, grad=False), meta(2, 80, 2, 2, 32, grad=False)
    assert spec_of(q, *kv.unbind(2), "bshd").startswith("layout=bshd_bs2hd ")


def test_ragged_and_paged_translate_to_their_layouts():
    q, kv = meta(1000, 8, 128, grad=False), meta(1000, 2, 128, grad=False)
    text = spec_of(q, kv, kv, "thd", sequences=5, max_q=333, max_kv=517, causal=True, padding=True)
    assert text == "layout=thd_thd_thd dtype=bf16 b=5 s_q=333 s_kv=517 h_q=8 h_kv=2 d_qk=128 d_v=128 window=-1,0 stats=0"
    qd, pool = meta(4, 1, 8, 128, grad=False), meta(64, 300, 2, 128, grad=False)  # sbhd pages of 64 tokens
    table = torch.empty(4, 16, device="meta", dtype=torch.int32)
    text = spec_of(qd, pool, pool, "bshd", "sbhd", sequences=table.shape[0], causal=True, align="bottom_right",
                   padding=True, kv_pages=table.shape[1])
    assert text == ("layout=bshd_paged_sbhd dtype=bf16 b=4 s_q=1 s_kv=1024 h_q=8 h_kv=2 d_qk=128 d_v=128 "
                    "page_size=64 pages=300 window=-1,0 align=bottom_right stats=0")
