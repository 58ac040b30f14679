"""fusedattn.transformers on a GPU: tiny random models of each family in BF16 with
attn_implementation="fusedattn" against the same weights in float32 with transformers' "eager"
attention (the truth), each within twice the error that the model's own BF16 attention ("sdpa", or
"eager" where sdpa lacks a softcap or sinks) shows against that truth: logits of plain, right- and
left-padded batches, a training step's loss and gradients, packed batches against each document
alone, greedy generation (every token fusedattn picks is the truth's choice up to a tie within that
tolerance), continuous batching (generate_batch), torch.compile in one graph, a static cache's
compiled decode (CUDA graphs), dropout.
Nothing is downloaded."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers not installed")
ft = pytest.importorskip("fusedattn.transformers")

from fusedattn import NotSupportedError  # noqa: E402
from transformers_tiny import FAMILIES, REFERENCE, batched, documents, model, padded_batch  # noqa: E402

SIZE = dict(head_dim=64, hidden=256, heads=4, kv_heads=2, window=16)
LENGTHS = (77, 40, 61)  # not multiples of 64; windows of 16 slide over them


@pytest.fixture(scope="module", autouse=True)
def registered():
    ft.register()
    ft.register("fusedattn_fallback", fallback=True)


def rel(ours, truth):
    return ((ours.float() - truth.float()).norm() / truth.float().norm()).item()


def pair(family, **options):
    """(truth: float32 with eager attention, net: the same weights in BF16), on the GPU."""
    truth = model(family, device="cuda", **SIZE, **options)
    truth.set_attn_implementation("eager")
    return truth, copy.deepcopy(truth).to(torch.bfloat16)


def run(net, implementation, *args, **kwargs):
    net.set_attn_implementation(implementation)
    with torch.no_grad():
        return net(*args, **kwargs).logits


def within(ours, theirs, truth, real=None):
    """fusedattn's BF16 error against the truth at most twice the model's own BF16 attention's."""
    if real is not None:
        ours, theirs, truth = ours[real], theirs[real], truth[real]
    mine, own = rel(ours, truth), rel(theirs, truth)
    assert mine == mine and mine <= 2 * own + 1e-3, f"fusedattn {mine:.2e}, the model's own {own:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["none", "right", "left"])
def test_logits_within_the_models_own_tolerance(family, side):
    truth, net = pair(family)
    ids, mask = padded_batch("right" if side == "none" else side, device="cuda",
                             lengths=(77, 77, 77) if side == "none" else LENGTHS)
    expected = run(truth, "eager", ids, attention_mask=mask)
    ours = run(net, "fusedattn", ids, attention_mask=mask)
    theirs = run(net, REFERENCE.get(family, "sdpa"), ids, attention_mask=mask)
    within(ours, theirs, expected, mask.bool())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_training_steps_loss_and_gradients_within_the_models_own_tolerance(family, side):
    truth, net = pair(family)
    ids, mask = padded_batch(side, device="cuda", lengths=LENGTHS)
    labels = ids.masked_fill(mask == 0, -100)
    labels[torch.arange(3), mask.argmax(1)] = -100  # a padding position's prediction: no loss
    grads, losses = {}, {}
    for name, (which, implementation) in {"truth": (truth, "eager"), "ours": (net, "fusedattn"),
                                          "theirs": (net, REFERENCE.get(family, "sdpa"))}.items():
        which.train().zero_grad()
        which.set_attn_implementation(implementation)
        loss = which(ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
        losses[name] = loss.detach()
        grads[name] = torch.cat([p.grad.float().flatten() for p in which.parameters() if p.grad is not None])
    within(losses["ours"].view(1), losses["theirs"].view(1), losses["truth"].view(1))
    within(grads["ours"], grads["theirs"], grads["truth"])


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])
@pytest.mark.parametrize("marked_by", ["position_ids", "keywords"])
def test_packed_documents_within_tolerance_of_each_alone(family, marked_by):
    truth, net = pair(family)
    docs, ids, positions, cu = documents((37, 90, 13), device="cuda")
    expected = torch.cat([run(truth, "eager", d) for d in docs], 1)
    theirs = torch.cat([run(net, REFERENCE.get(family, "sdpa"), d) for d in docs], 1)
    keywords = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=90, max_length_k=90) \
        if marked_by == "keywords" else {}
    ours = run(net, "fusedattn", ids, position_ids=positions, use_cache=False, **keywords)
    within(ours, theirs, expected)


def test_packed_sinks_are_refused_with_the_cores_reasons():
    _, net = pair("gpt_oss")
    _, ids, positions, cu = documents((37, 90, 13), device="cuda")
    with pytest.raises(NotSupportedError, match="sink"):
        run(net, "fusedattn", ids, position_ids=positions, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
            max_length_q=90, max_length_k=90)


def teacher_forced(net, implementation, tokens, mask):
    """The logits of a generated sequence in one forward, its positions counted as generate() counts
    them (from each row's first real token)."""
    full_mask = torch.cat([mask, torch.ones_like(tokens[:, mask.shape[1]:])], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    return run(net, implementation, tokens, attention_mask=full_mask, position_ids=positions).float(), full_mask


def agrees(tokens, truth, prompt, mask, tolerance):
    """Every generated token is the truth's greedy choice given the tokens before it, up to a tie:
    its logit within `tolerance` of the best one."""
    logits = teacher_forced(truth, "eager", tokens, mask)[0][:, prompt - 1:-1]
    chosen = logits.gather(-1, tokens[:, prompt:, None])[..., 0]
    gap = (logits.amax(-1) - chosen).max().item()
    assert gap <= tolerance, f"a token {gap:.3f} below the truth's best (tolerance {tolerance:.3f})"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_picks_the_truths_tokens(family, cache):
    truth, net = pair(family)
    ids, mask = padded_batch("left", device="cuda", lengths=LENGTHS)
    options = dict(attention_mask=mask, max_new_tokens=24, do_sample=False)
    if cache == "static":  # compiled decoding: test_a_static_caches_compiled_decode_picks_the_truths_tokens
        options.update(cache_implementation="static", disable_compile=True)
    reference = REFERENCE.get(family, "sdpa")
    net.set_attn_implementation(reference)
    theirs = net.generate(ids, **options)
    # The tolerance: how far the model's own BF16 logits stray from the truth on its own tokens.
    own, full_mask = teacher_forced(net, reference, theirs, mask)
    stray = (own - teacher_forced(truth, "eager", theirs, mask)[0])[full_mask.bool()].abs().max().item()
    net.set_attn_implementation("fusedattn")
    ours = net.generate(ids, **options)
    agrees(ours, truth, ids.shape[1], mask, 4 * stray + 1e-3)
    agrees(theirs, truth, ids.shape[1], mask, 4 * stray + 1e-3)


@pytest.mark.parametrize("family", [family for family in FAMILIES if family != "gpt_oss"])
def test_continuous_batching_picks_the_truths_tokens(family):
    # generate_batch() runs "paged|fusedattn" (packed sequences over transformers' paged cache); each
    # request's tokens against the truth, within the model's own BF16 attention's stray on them.
    truth, net = pair(family)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 97, (n,), generator=generator).tolist() for n in LENGTHS]
    config = transformers.GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=-1, pad_token_id=0)
    net.set_attn_implementation("fusedattn")
    out = batched(net, prompts, config)
    reference = REFERENCE.get(family, "sdpa")
    for i, prompt in enumerate(prompts):
        tokens = torch.tensor([prompt + out[f"req_{i}"].generated_tokens], device="cuda")
        assert tokens.shape[1] == len(prompt) + 24
        mask = torch.ones(1, len(prompt), dtype=torch.long, device="cuda")
        own, _ = teacher_forced(net, reference, tokens, mask)
        stray = (own - teacher_forced(truth, "eager", tokens, mask)[0]).abs().max().item()
        agrees(tokens, truth, len(prompt), mask, 4 * stray + 1e-3)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
def test_a_compiled_training_step_is_one_graph_and_equals_eager(family):
    _, net = pair(family)
    ids, mask = padded_batch("right", device="cuda", lengths=LENGTHS)
    net.train().set_attn_implementation("fusedattn")
    eager = net(ids, attention_mask=mask, labels=ids, use_cache=False).loss
    torch._dynamo.reset()
    compiled = torch.compile(net, fullgraph=True)
    loss = compiled(ids, attention_mask=mask, labels=ids, use_cache=False).loss
    loss.backward()
    torch.testing.assert_close(loss, eager, rtol=2e-2, atol=2e-2)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in net.parameters())


def test_a_static_caches_compiled_decode_picks_the_truths_tokens():
    """transformers compiles a static cache's decode step (mode "reduce-overhead": CUDA graphs)."""
    truth, net = pair("llama")
    ids, mask = padded_batch("left", device="cuda", lengths=LENGTHS)
    net.set_attn_implementation("fusedattn")
    eager = net.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                         cache_implementation="static", disable_compile=True)
    own, full_mask = teacher_forced(net, "fusedattn", eager, mask)
    stray = (own - teacher_forced(truth, "eager", eager, mask)[0])[full_mask.bool()].abs().max().item()
    torch._dynamo.reset()
    compiled = net.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                            cache_implementation="static",
                            compile_config=transformers.CompileConfig(fullgraph=True))
    agrees(compiled, truth, ids.shape[1], mask, 4 * stray + 1e-3)


def test_dropout_draws_a_mask_that_the_seed_replays():
    _, net = pair("llama")
    net.config.attention_dropout = 0.25
    for layer in net.model.layers:
        layer.self_attn.attention_dropout = 0.25
    ids, mask = padded_batch("right", device="cuda", lengths=LENGTHS)
    net.train().set_attn_implementation("fusedattn")
    losses = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        losses.append(net(ids, attention_mask=mask, labels=ids, use_cache=False).loss)
    losses[0].backward()
    assert torch.isfinite(losses[0]) and losses[0] == losses[1] and losses[0] != losses[2]


def test_a_float32_model_is_refused_or_falls_back_to_sdpa():
    truth, _ = pair("llama")
    ids, mask = padded_batch("right", device="cuda", lengths=LENGTHS)
    expected = run(truth, "eager", ids, attention_mask=mask)
    ft.reset_fallback_counts()
    torch.testing.assert_close(run(truth, "fusedattn_fallback", ids, attention_mask=mask)[mask.bool()],
                               expected[mask.bool()], rtol=1e-4, atol=1e-4)
    assert sum(ft.fallback_counts().values()) == truth.config.num_hidden_layers
    with pytest.raises(NotSupportedError, match="float32 attention"):
        run(truth, "fusedattn", ids, attention_mask=mask)
