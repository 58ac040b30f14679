"""fusedattn.transformers end to end on the CPU: tiny random models of each family with
attn_implementation="fusedattn", fusedattn.torch.attention replaced by a float64 stand-in of its
meaning (transformers_stand_in.py), against the same models with transformers' own "eager"
attention in float32: logits of plain, right- and left-padded and packed batches, a training step's
gradients, greedy generation with dynamic and static caches (the same tokens), and the roads the
calls take (padding as runtime lengths, never a dense mask; decode steps as one row of bias; packed
batches as thd). Also registration, refusals and the counted fallback. The real kernels: the GPU
file, test_transformers_gpu.py."""
import logging

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
ft = pytest.importorskip("fusedattn.transformers")
fat = pytest.importorskip("fusedattn.torch")

import transformers_stand_in as stand_in  # noqa: E402
from fusedattn import NotSupportedError  # noqa: E402
from fusedattn.transformers import _attention  # noqa: E402
from transformers_tiny import FAMILIES, batched, documents, model, padded_batch  # noqa: E402


@pytest.fixture(autouse=True)
def float64_attention(monkeypatch):
    ft.register()
    ft.register("fusedattn_fallback", fallback=True)
    monkeypatch.setattr(fat, "attention", stand_in.attention)
    monkeypatch.setattr(_attention, "DTYPES", _attention.DTYPES + (torch.float32,))  # the stand-in's
    stand_in.calls.clear()


def logits(net, implementation, *args, **kwargs):
    net.set_attn_implementation(implementation)
    with torch.no_grad():
        return net(*args, **kwargs).logits


def test_register_makes_the_name_an_attention_implementation():
    assert ft.register() == "fusedattn"
    assert "fusedattn" in transformers.AttentionInterface._global_mapping
    assert "fusedattn" in transformers.masking_utils.AttentionMaskInterface._global_mapping
    net = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
        vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2),
        attn_implementation="fusedattn")
    assert net.config._attn_implementation == "fusedattn"
    net.set_attn_implementation("eager")
    net.set_attn_implementation("fusedattn")
    assert net.config._attn_implementation == "fusedattn"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["none", "right", "left"])
def test_logits_equal_eager_attention(family, side):
    net = model(family)
    ids, mask = padded_batch("right" if side == "none" else side, lengths=(13, 13, 13) if side == "none" else
                             (13, 8, 11))
    theirs = logits(net, "eager", ids, attention_mask=mask)
    stand_in.calls.clear()
    ours = logits(net, "fusedattn", ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)
    assert stand_in.calls and not any(call["bias"] for call in stand_in.calls)  # never a dense mask
    assert all(call["lengths"] == (side != "none") for call in stand_in.calls)
    if family in ("gemma2", "gemma3", "gpt_oss", "qwen2", "mistral"):
        assert {call["window"] for call in stand_in.calls} >= {(6, -1)}
    assert all(call["softcap"] == (family == "gemma2") for call in stand_in.calls)
    assert all(call["sink"] == (family == "gpt_oss") for call in stand_in.calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_gradients_equal_eager_attention_on_a_left_padded_batch(family):
    ids, mask = padded_batch("left")
    # No loss where a padding position predicts: its rows see no real key, and what attention gives
    # there is each implementation's own (fusedattn: zeros).
    labels = ids.masked_fill(mask == 0, -100)
    labels[torch.arange(3), mask.argmax(1)] = -100
    grads = {}
    for implementation in ("eager", "fusedattn"):
        net = model(family).train()
        net.set_attn_implementation(implementation)
        net(ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
        grads[implementation] = {name: p.grad for name, p in net.named_parameters() if p.grad is not None}
    assert grads["eager"].keys() == grads["fusedattn"].keys()
    for name, grad in grads["eager"].items():
        torch.testing.assert_close(grads["fusedattn"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])  # gpt-oss: packed by keywords only
def test_packed_by_position_ids_equals_each_document_alone(family):
    net = model(family)
    docs, ids, positions, _ = documents()
    alone = torch.cat([logits(net, "eager", d) for d in docs], 1)
    stand_in.calls.clear()
    packed = logits(net, "fusedattn", ids, position_ids=positions, use_cache=False)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert {call["layout"] for call in stand_in.calls} == {"thd"}


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_by_flash_keywords_equals_each_document_alone(family):
    net = model(family)
    docs, ids, positions, cu = documents()
    alone = torch.cat([logits(net, "eager", d) for d in docs], 1)
    stand_in.calls.clear()
    packed = logits(net, "fusedattn", ids, position_ids=positions, use_cache=False, cu_seq_lens_q=cu,
                    cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert {(call["layout"], call["align"]) for call in stand_in.calls} == {("thd", "top_left")}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_gives_eagers_tokens_from_left_padded_prompts(family, cache):
    net = model(family)
    ids, mask = padded_batch("left")
    options = dict(attention_mask=mask, max_new_tokens=9, do_sample=False)  # past the window of 6
    if cache == "static":
        options["cache_implementation"] = "static"
    tokens = {}
    for implementation in ("eager", "fusedattn"):
        net.set_attn_implementation(implementation)
        stand_in.calls.clear()
        tokens[implementation] = net.generate(ids, **options)[:, ids.shape[1]:]
    assert torch.equal(tokens["fusedattn"], tokens["eager"])
    # Decode steps with padding among their keys take one row of bias; a sliding cache past the
    # padding has none left in view, and runs plain (Mistral's layers all slide).
    decode = [call for call in stand_in.calls if call["shapes"][0][1] == 1]
    assert any(call["bias"] for call in decode) == (family != "mistral")
    assert all((call["bias"] and not call["causal"]) or (call["causal"] and call["align"] == "bottom_right")
               for call in decode)
    assert not any(call["bias"] for call in stand_in.calls if call["shapes"][0][1] > 1)


@pytest.mark.parametrize("family", [family for family in FAMILIES if family != "gpt_oss"])
def test_continuous_batching_gives_each_prompts_own_tokens(family):
    # generate_batch() runs "paged|fusedattn": every step's requests packed as sequences over
    # transformers' paged cache, against eager generate() of each prompt alone. Prompts of 10, 3
    # and 7 tokens and 9 new ones: past the window of 6, so sliding layers read their ring of keys.
    # (gpt-oss's sinks beside packed sequences are refused by the core, which the stand-in is not.)
    net = model(family)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 6, 7], [9, 8, 7, 6, 5, 4, 3]]
    net.set_attn_implementation("fusedattn")
    config = transformers.GenerationConfig(max_new_tokens=9, do_sample=False, eos_token_id=-1, pad_token_id=0)
    out = batched(net, prompts, config)
    calls = list(stand_in.calls)
    net.set_attn_implementation("eager")
    for i, prompt in enumerate(prompts):
        alone = net.generate(torch.tensor([prompt]), max_new_tokens=9, do_sample=False)[0, len(prompt):]
        assert out[f"req_{i}"].generated_tokens == alone.tolist(), i
    assert calls and all(call["layout"] == "thd" and call["causal"] and call["align"] == "bottom_right" and
                         not call["bias"] for call in calls)
    assert any(call["window"] == (6, -1) for call in calls) == (family in ("mistral", "qwen2", "gemma2", "gemma3"))


def test_decode_steps_without_padding_are_bottom_right_causal():
    net = model("llama")
    ids = torch.randint(0, 97, (2, 7))
    net.set_attn_implementation("fusedattn")
    net.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    decode = [call for call in stand_in.calls if call["shapes"][0][1] == 1]
    assert decode and all(call["causal"] and call["align"] == "bottom_right" and not call["bias"]
                          for call in decode)


def test_a_mask_made_by_the_caller_runs_as_a_bias():
    net = model("llama")
    ids, mask = padded_batch("right")
    four_d = transformers.masking_utils.sdpa_mask(batch_size=3, q_length=13, kv_length=13,
                                                   attention_mask=mask.bool(), allow_is_causal_skip=False)
    ours = logits(net, "fusedattn", ids, attention_mask=four_d)
    theirs = logits(net, "eager", ids, attention_mask=mask)
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], rtol=1e-5, atol=1e-5)


def custom_mask(batch, length):
    """A mask with conditions of the model's own (an or_mask_function: the first two tokens see each
    other), as multimodal models add them."""
    return ft.mask(batch_size=batch, q_length=length, kv_length=length, use_vmap=True,
                   mask_function=transformers.masking_utils.or_masks(
                       transformers.masking_utils.causal_mask_function, lambda b, h, q, kv: (q < 2) & (kv < 2)))


def test_conditions_of_the_models_own_are_refused_with_the_reason():
    net = model("llama")
    q = torch.randn(2, 4, 5, 16)
    k = torch.randn(2, 2, 5, 16)
    with pytest.raises(NotSupportedError, match="or_mask_function"):
        ft.attention(net.model.layers[0].self_attn, q, k, k, custom_mask(2, 5))


def test_the_fallback_runs_transformers_attention_counted_and_logged_once(caplog):
    net = model("llama")
    layer = net.model.layers[0].self_attn
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    fallback = transformers.AttentionInterface._global_mapping["fusedattn_fallback"]
    ft.reset_fallback_counts()
    with caplog.at_level(logging.WARNING, logger="fusedattn"):
        first, _ = fallback(layer, q, k, k, custom_mask(2, 5), scaling=0.25)
        fallback(layer, q, k, k, custom_mask(2, 5), scaling=0.25)
    expected, _ = transformers.integrations.sdpa_attention.sdpa_attention_forward(
        layer, q, k, k, transformers.masking_utils.sdpa_mask(**custom_mask(2, 5).recipe), scaling=0.25)
    torch.testing.assert_close(first, expected)
    assert list(ft.fallback_counts().values()) == [2]
    assert len([r for r in caplog.records if "falling back" in r.getMessage()]) == 1
    assert not stand_in.calls


def test_a_window_without_the_causal_mask_is_refused():
    layer = model("mistral").model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 16)
    with pytest.raises(NotSupportedError, match="sliding_window"):
        ft.attention(layer, q, q[:, :2], q[:, :2], None, sliding_window=3, is_causal=False)


def test_a_float32_model_is_refused_naming_the_dtype(monkeypatch):
    monkeypatch.setattr(_attention, "DTYPES", (torch.float16, torch.bfloat16))
    layer = model("llama").model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 16)
    with pytest.raises(NotSupportedError, match="float32 attention"):
        ft.attention(layer, q, q[:, :2], q[:, :2], None)


def test_the_fallback_never_runs_packed_keywords_as_one_sequence():
    layer = model("llama").model.layers[0].self_attn
    q, k = torch.randn(1, 4, 6, 16), torch.randn(1, 2, 6, 16)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    fallback = transformers.AttentionInterface._global_mapping["fusedattn_fallback"]
    with pytest.raises(NotSupportedError, match="or_mask_function"):
        fallback(layer, q, k, k, custom_mask(1, 6), cu_seq_lens_q=cu, cu_seq_lens_k=cu)


def test_dropout_goes_to_the_call(monkeypatch):
    seen = []
    monkeypatch.setattr(fat, "attention", lambda *a, **options: seen.append(options) or torch.zeros(1, 5, 4, 16))
    layer = model("llama").model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 16)
    ft.attention(layer, q, q[:, :2], q[:, :2], None, dropout=0.25, scaling=0.5)
    assert seen[0]["dropout_p"] == 0.25 and seen[0]["scale"] == 0.5 and seen[0]["causal"]
