"""Context parallelism's block kernels: a block of keys against q through fusedattn's own forward and
backward bodies (_bodies.py), under the mask of one piece of the schedule (_cp_schedule.py)."""
import torch

from .. import _context_parallel as _cp
from ._bodies import backward_body, forward_body
from ._call_config import config_text
from ._tensors import Extras


class FusedattnBlocks:
    """A block of keys against q through fusedattn's kernels: forward (O float32, statistics
    [b, h, s_q], or [tokens, h] packed) and backward with the O and statistics given, under a
    piece's mask (_cp.pieces): none, the diagonal from the top-left (causal, or a window's bounds),
    or a band j - i >= offset (j - i <= offset) as the score modifier _cp.BAND (_cp.BAND_BELOW),
    whose offset is a runtime scalar (one plan for every offset). `packed` (a Packed): q, k, v are
    halves of packed parts (thd), one ragged call over their sequences."""

    def __init__(self, scale):
        self.scale = scale

    def _config(self, mask, packed=None):
        causal, window, score_mod = _cp.mask_options(mask)
        return config_text(layout="thd" if packed else "bshd", causal=causal, window=window,
                           padding=packed is not None, stats=True, score_mod=score_mod)

    def _extras(self, mask, q, packed=None):
        scalars = torch.tensor([float(mask[1])], dtype=torch.float32, device=q.device) \
            if mask[0] in (_cp.BAND_PIECE, _cp.BAND_UPPER) else None
        bands = [x.to(q.device, torch.float32) for x in mask[1]] if mask[0] == _cp.SEQUENCE_BAND else (None, None)
        offsets = packed.cu if packed is not None else None
        return Extras(mod_scalars=scalars, mod_t0=bands[0], mod_t1=bands[1], cu_seqlens_q=offsets,
                      cu_seqlens_kv=offsets)

    def forward(self, q, k, v, mask, packed=None):
        longest = packed.max_seqlen if packed is not None else 0
        o, stats, _ = forward_body(q, k, v, bias=None, sink=None, extras=self._extras(mask, q, packed),
                                   config=self._config(mask, packed), scale=self.scale, max_seqlen_q=longest,
                                   max_seqlen_kv=longest)
        return o.float(), stats

    def backward(self, q, k, v, o, stats, d_o, mask, packed=None):
        # q, k, v may be views (the core takes their strides); O, dO and the statistics are read as
        # the dense tensors the core allocates, so halves of them are copied.
        longest = packed.max_seqlen if packed is not None else 0
        d_q, d_k, d_v, _, _ = backward_body(d_o.contiguous(), q, k, v, o.contiguous(), stats.contiguous(), bias=None,
                                            sink=None, extras=self._extras(mask, q, packed),
                                            config=self._config(mask, packed), scale=self.scale,
                                            max_seqlen_q=longest, max_seqlen_kv=longest)
        return d_q.float(), d_k.float(), d_v.float()
