"""Tiny randomly initialized models of the families fusedattn.transformers serves, and the batches the
tests run through them (padded on either side, packed), and continuous batching's call, shared by the
CPU tests (through the float64 stand-in) and the GPU tests. Nothing is downloaded."""
import pytest
import torch
import transformers

VOCAB = 97


def config(family, *, window=6, layers=2, heads=4, kv_heads=2, head_dim=16, hidden=64):
    """A family's config at a tiny size: Llama; Mistral (a window on every layer); Qwen2 (sliding
    layers below max_window_layers); Qwen3; Gemma 2 (attention softcap, sliding and full layers in
    turn); Gemma 3 (text; sliding and full in turn); gpt-oss (sinks, sliding and full in turn)."""
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  max_position_embeddings=512, attention_dropout=0.0)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=window)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=window,
                                        max_window_layers=layers // 2)
    if family == "qwen3":
        return transformers.Qwen3Config(**common)
    if family == "gemma2":
        return transformers.Gemma2Config(**common, sliding_window=window, attn_logit_softcapping=5.0,
                                         final_logit_softcapping=30.0, query_pre_attn_scalar=head_dim)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(**common, sliding_window=window, sliding_window_pattern=2)
    if family == "gpt_oss":
        return transformers.GptOssConfig(**common, sliding_window=window, num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(family)


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt_oss")
# Where the model's own "sdpa" lacks a feature (softcap, sinks), its "eager" is the reference.
REFERENCE = {"gemma2": "eager", "gpt_oss": "eager"}


def model(family, *, seed=0, dtype=torch.float32, device="cpu", **options):
    """A family's tiny model with random weights (gpt-oss's sinks drawn too: they start at zero), in
    eval mode, generating without an end-of-sequence token."""
    torch.manual_seed(seed)
    made = transformers.AutoModelForCausalLM.from_config(config(family, **options)).to(device=device, dtype=dtype)
    for module in made.modules():
        if hasattr(module, "sinks"):
            torch.nn.init.normal_(module.sinks, std=1.0)
    made.generation_config.eos_token_id = None  # every row generates every token asked for
    return made.eval()


def padded_batch(side, *, lengths=(13, 8, 11), device="cpu", seed=1):
    """(input_ids [b, s], attention_mask [b, s]) with rows of `lengths` real tokens padded on `side`
    ("right" or "left") to the longest."""
    generator = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.randint(0, VOCAB, (len(lengths), longest), generator=generator)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, length in enumerate(lengths):
        if side == "right":
            mask[row, :length] = 1
        else:
            mask[row, longest - length:] = 1
    return ids.to(device), mask.to(device)


def documents(lengths=(5, 9, 3), *, device="cpu", seed=2):
    """Documents of `lengths` tokens: the list of [1, n] ids, and the same packed in one row with
    position ids restarting at each, and their cu_seqlens (int32)."""
    generator = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, VOCAB, (1, n), generator=generator).to(device) for n in lengths]
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=device)
    return docs, torch.cat(docs, 1), positions, cu


def batched(net, prompts, config):
    """generate_batch's output, or a skip where this transformers takes no continuous batching but
    by its own implementations' names (5.25 refuses any other before a call is made)."""
    try:
        return net.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    except ValueError as error:
        if "not supported for continuous batching" not in str(error):
            raise
        pytest.skip(f"transformers {transformers.__version__}: {error}")
