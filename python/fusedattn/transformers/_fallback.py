"""The fallback, where the caller registered with fallback=True: a call fusedattn refuses
(NotSupportedError, and nothing else) runs transformers' own attention instead, "sdpa", or the
model's "eager" where sdpa lacks the feature (a softcap, sinks). Its mask is transformers' own,
built from the arguments the FusedMask kept. Every fallback is counted by its reason (counts()) and
each reason is logged once."""
import collections
import logging
import sys

from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import eager_mask, sdpa_mask

from ._masks import FusedMask

_LOG = logging.getLogger("fusedattn")
_COUNTS = collections.Counter()


def counts():
    """{reason: calls that fell back for it} since the process started (or reset())."""
    return dict(_COUNTS)


def reset():
    _COUNTS.clear()


def _eager_of(module):
    """The model's own eager attention (every modeling file defines eager_attention_forward), or None."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def run(module, query, key, value, mask, error, *, dropout, scaling, sliding_window, softcap, is_causal, s_aux,
        kwargs):
    """transformers' attention for one refused call: (O [b, s_q, h_q, d_v], None)."""
    eager = _eager_of(module) if softcap is not None or s_aux is not None else None
    if eager is not None and mask is None:
        raise error  # the eager attention takes its causal mask from the mask, and there is none to build
    if kwargs.get("cu_seq_lens_q") is not None:
        raise error  # sdpa and eager read no packed-sequence keywords: they would mix the documents
    reason = str(error).split("\n")[0]
    _COUNTS[reason] += 1
    if _COUNTS[reason] == 1:
        _LOG.warning("fusedattn.transformers: falling back to transformers' %s attention: %s",
                     "eager" if eager is not None else "sdpa", error)
    if isinstance(mask, FusedMask):  # transformers' own mask, from what fusedattn's was made of
        mask = (eager_mask if eager is not None else sdpa_mask)(**mask.recipe)
    if eager is not None:
        return eager(module, query, key, value, mask, dropout=dropout, scaling=scaling, sliding_window=sliding_window,
                     softcap=softcap, s_aux=s_aux, **kwargs)
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, softcap=softcap, **kwargs)
