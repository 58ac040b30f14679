"""fusedattn.transformers — fusedattn as an attention implementation of Hugging Face transformers.

    import fusedattn.transformers
    fusedattn.transformers.register()                   # once per process
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fusedattn", dtype=torch.bfloat16)
    # or, on a model already loaded: model.set_attn_implementation("fusedattn")

register() adds "fusedattn" to transformers' AttentionInterface (the attention function,
_attention.py) and to its AttentionMaskInterface (_masks.py), so that a model's masks reach fusedattn
as what they mean (runtime lengths, a decode step's row of keys, packed sequences) and no
[b, 1, s_q, s_kv] mask is built. Causal prefill and training, scaling, softcaps (Gemma 2),
sliding windows (Mistral, Qwen2, Gemma's alternating layers), sinks (gpt-oss), dropout, padded
batches padded on either side, packed batches, and generation with a KV cache, in eager and
compiled code; and continuous batching (model.generate_batch(...), "paged|fusedattn", which it
picks from "fusedattn") over transformers' paged cache. What fusedattn cannot run raises
NotSupportedError with its reasons; with register(fallback=True) it runs transformers' "sdpa" (or
the model's "eager" for a softcap or sinks) instead, each reason logged once and counted
(fallback_counts()). docs/transformers.md says what each model family gets.

Importing this module needs transformers; `import fusedattn` does not.
"""
try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as missing:  # say what to install, not only what is missing
    raise ImportError("fusedattn.transformers needs transformers 5 or newer: pip install 'transformers>=5'") \
        from missing

from ..errors import NotSupportedError
from . import _attention, _fallback
from ._masks import FusedMask, fusedattn_mask

__all__ = ["register", "attention", "mask", "FusedMask", "fallback_counts", "reset_fallback_counts"]

mask = fusedattn_mask


def _attention_function(fallback):
    """The registered function: fusedattn's call, or with `fallback` transformers' own on refusal."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                  softcap=None, is_causal=None, s_aux=None, **kwargs):
        arguments = dict(dropout=dropout, scaling=scaling, sliding_window=sliding_window, softcap=softcap,
                         is_causal=is_causal, s_aux=s_aux, kwargs=kwargs)
        try:
            return _attention.forward(module, query, key, value, attention_mask, **arguments), None
        except NotSupportedError as error:
            if not fallback:
                raise
            return _fallback.run(module, query, key, value, attention_mask, error, **arguments)

    attention.__name__ = attention.__qualname__ = "fusedattn_attention_fallback" if fallback else "fusedattn_attention"
    return attention


attention = _attention_function(fallback=False)
_with_fallback = _attention_function(fallback=True)


def register(name: str = "fusedattn", *, fallback: bool = False) -> str:
    """Registers fusedattn with transformers under `name` (attention and mask interfaces), so that
    attn_implementation=name and model.set_attn_implementation(name) take it; returns `name`.
    fallback=True runs transformers' own attention for a call fusedattn refuses (logged once per
    reason, counted by fallback_counts()); without it such a call raises NotSupportedError."""
    function = _with_fallback if fallback else attention
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, fusedattn_mask)
    # Continuous batching (generate_batch) asks for "paged|" + name: the same function, which takes its
    # paged cache and packed offsets (_paged.py); it builds no mask, so none is registered.
    AttentionInterface.register("paged|" + name, function)
    return name


def fallback_counts():
    """{reason: calls that ran transformers' attention instead} since the start or the last reset."""
    return _fallback.counts()


def reset_fallback_counts():
    _fallback.reset()

