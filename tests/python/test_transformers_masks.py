"""fusedattn.transformers' masks on the CPU: what transformers' mask interface is answered with
(plain, runtime lengths over tokens moved to the front, a decode step's bias, custom), worked by hand
on small cases, and, over padding on either side, caches (dynamic, sliding, static), windows and
both the eager and the compiled form, the keys each real query sees equal to transformers' own sdpa
mask of the same arguments. No GPU, no model."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
pytest.importorskip("transformers", reason="transformers not installed")
masking_utils = pytest.importorskip("transformers.masking_utils")
ft = pytest.importorskip("fusedattn.transformers")

from fusedattn.transformers import _padding  # noqa: E402
from transformers_stand_in import visible  # noqa: E402


def make(attention_mask, q_length, kv_length, q_offset=0, kv_offset=0, window=None, **kwargs):
    """fusedattn's mask for the arguments transformers' create_causal_mask (window None) or
    create_sliding_window_causal_mask passes."""
    function = masking_utils.causal_mask_function if window is None else \
        masking_utils.sliding_window_causal_mask_function(window)
    batch = attention_mask.shape[0] if attention_mask is not None else 1
    bool_mask = attention_mask.bool() if attention_mask is not None else None
    return ft.mask(batch_size=batch, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
                   mask_function=function, attention_mask=bool_mask, local_size=window, dtype=torch.float32, **kwargs)


def keys_seen(fused):
    """bool [b, q_length, kv_length]: which keys each query sees by the FusedMask's meaning (in the
    original positions), as fusedattn computes it from what the mask carries."""
    recipe = fused.recipe
    b, s_q, s_kv = recipe["batch_size"], recipe["q_length"], recipe["kv_length"]
    window = (fused.window, -1) if fused.window is not None else (-1, -1)
    if fused.kind == "decode":
        return (fused.bias == 0)[:, 0].expand(b, s_q, s_kv)
    if fused.kind == "plain":
        align = "top_left" if s_q == s_kv else "bottom_right"
        return visible(s_q, s_kv, s_q, s_kv, fused.causal, align, window).expand(b, s_q, s_kv)
    align = "top_left" if fused.top_left else "bottom_right"
    out = []
    for entry in range(b):
        moved = visible(s_q, s_kv, int(fused.seq_len_q[entry]), int(fused.seq_len_kv[entry]), fused.causal, align,
                        window)
        rows = fused.restore_q[entry] if fused.restore_q is not None else torch.arange(s_q)
        cols = torch.arange(s_kv) if fused.order_kv is None else torch.argsort(fused.order_kv[entry])
        out.append(moved[rows][:, cols])
    return torch.stack(out)


def transformers_keys(fused):
    recipe = dict(fused.recipe, allow_is_causal_skip=False)
    return masking_utils.sdpa_mask(**recipe)[:, 0]


def padding(kind, b, n):
    """A 2D padding mask (1 keeps) of b rows and n positions: none, right, left, both sides, holes."""
    mask = torch.ones(b, n, dtype=torch.long)
    lengths = [n - 3 * i for i in range(b)]
    for row, length in enumerate(lengths):
        if kind == "right":
            mask[row, length:] = 0
        elif kind == "left":
            mask[row, :n - length] = 0
        elif kind == "both":
            mask[row, :row] = 0
            mask[row, n - row:] = 0
        elif kind == "holes":
            mask[row, 1:1 + row] = 0
    return mask


def real_queries(fused):
    keys, queries = _padding.validity(fused.recipe["attention_mask"], fused.recipe["batch_size"],
                                      fused.recipe["q_length"], fused.recipe["kv_length"], fused.recipe["q_offset"],
                                      fused.recipe["kv_offset"], "cpu")
    return queries


# (q_length, kv_length, q_offset, kv_offset, mask length): prefill, a decode step, a chunk after a
# cache, a sliding cache's view, a static cache (slots past the last query) at prefill and decode.
SHAPES = {"prefill": (11, 11, 0, 0, 11), "decode": (1, 12, 11, 0, 12), "chunk": (4, 15, 11, 0, 15),
          "sliding": (1, 5, 11, 7, 12), "static_prefill": (11, 16, 0, 0, 11), "static_decode": (1, 16, 11, 0, 12)}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pad", ["none", "right", "left", "both", "holes"])
def test_every_real_query_sees_the_keys_transformers_mask_gives_it(pad, shape, window, compiled, monkeypatch):
    if pad == "holes" and window is not None:
        pytest.skip("with holes in a row the window counts real tokens, not positions (docs/transformers.md)")
    q_length, kv_length, q_offset, kv_offset, n = SHAPES[shape]
    if shape.startswith("static"):
        q_offset = torch.tensor(q_offset)  # a static cache gives its offset as a tensor
    if compiled:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    mask = padding(pad, 3, n)
    if pad != "none" and q_length == 1:
        mask[:, -1] = 1  # a decode step's own token is real
    fused = make(mask, q_length, kv_length, q_offset, kv_offset, window)
    ours, theirs = keys_seen(fused), transformers_keys(fused)
    real = real_queries(fused)
    assert torch.equal(ours[real], theirs[real]), (fused, ours.int(), theirs.int())


def test_no_padding_is_the_plain_causal_call():
    fused = make(None, 9, 9)
    assert fused.kind == "plain" and fused.top_left and not fused.packed_hint
    assert make(torch.ones(2, 9), 9, 9).kind == "plain"  # eager: all ones is no padding
    assert make(torch.ones(2, 12), 1, 12, q_offset=11).kind == "plain"  # a decode step without padding


def test_right_padding_is_runtime_lengths_and_nothing_moves():
    fused = make(torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]), 4, 4)
    assert fused.kind == "padded" and fused.top_left
    assert fused.seq_len_q.tolist() == [4, 2] and fused.seq_len_kv.tolist() == [4, 2]
    assert fused.seq_len_q.dtype == torch.int32
    assert fused.order_q is None and fused.order_kv is None and fused.restore_q is None


def test_left_padding_moves_the_real_tokens_to_the_front():
    fused = make(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]), 5, 5)
    assert fused.kind == "padded"
    assert fused.seq_len_q.tolist() == [3, 5]
    assert fused.order_q.tolist() == [[2, 3, 4, 0, 1], [0, 1, 2, 3, 4]]     # the moved row's tokens
    assert fused.restore_q.tolist() == [[3, 4, 0, 1, 2], [0, 1, 2, 3, 4]]   # and where each went
    x = torch.arange(10.).view(2, 5, 1)
    moved = _padding.take_rows(x, fused.order_q)
    assert moved[0, :, 0].tolist() == [2., 3., 4., 0., 1.]
    assert torch.equal(_padding.take_rows(moved, fused.restore_q), x)


def test_traced_calls_take_the_general_form_with_fixed_shapes(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fused = make(torch.ones(2, 6), 6, 6)
    assert fused.kind == "padded" and fused.order_q is not None and fused.order_kv is not None
    assert fused.seq_len_q.tolist() == [6, 6]
    assert make(None, 6, 6).kind == "plain"  # nothing to read without a padding mask
    decode = make(torch.ones(2, 7), 1, 7, q_offset=6)
    assert decode.kind == "decode" and decode.bias.shape == (2, 1, 1, 7)


def test_a_decode_step_with_padding_is_one_row_of_bias():
    fused = make(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]), 1, 5, q_offset=4)
    assert fused.kind == "decode" and fused.bias.shape == (2, 1, 1, 5) and fused.bias.dtype == torch.float32
    lowest = torch.finfo(torch.float32).min
    assert fused.bias[:, 0, 0].tolist() == [[lowest, lowest, 0, 0, 0], [0, 0, 0, 0, 0]]
    windowed = make(torch.tensor([[0, 1, 1, 1, 1]]), 1, 5, q_offset=4, window=2)
    assert windowed.bias[0, 0, 0].tolist() == [lowest, lowest, lowest, 0, 0]


def test_a_static_caches_empty_slots_are_not_keys():
    fused = make(torch.ones(1, 3), 1, 6, q_offset=torch.tensor(2))
    lowest = torch.finfo(torch.float32).min
    assert fused.kind == "decode" and fused.bias[0, 0, 0].tolist() == [0, 0, 0, lowest, lowest, lowest]


def test_a_bidirectional_mask_is_not_causal():
    fused = ft.mask(batch_size=1, q_length=5, kv_length=5, mask_function=masking_utils.bidirectional_mask_function,
                    allow_is_causal_skip=False, allow_is_bidirectional_skip=True)
    assert not fused.causal and make(None, 5, 5).causal


def test_models_own_conditions_are_custom_and_packing_is_a_hint():
    assert make(None, 5, 5, use_vmap=True).kind == "custom"
    assert make(None, 5, 5, allow_is_causal_skip=False).packed_hint


def test_a_mask_made_ahead_is_handed_on():
    fused = make(torch.ones(1, 3), 1, 6, q_offset=torch.tensor(2))
    assert fused.ndim == 4  # what transformers reads to hand a prepared mask on
    assert ft.mask(batch_size=1, q_length=1, kv_length=6, attention_mask=fused) is fused


def test_validity_marks_keys_past_the_mask_and_the_last_query():
    keys, queries = _padding.validity(torch.tensor([[False, True, True]]), 1, 2, 5, 1, 0, "cpu")
    assert keys.tolist() == [[False, True, True, False, False]]
    assert queries.tolist() == [[True, True]]
