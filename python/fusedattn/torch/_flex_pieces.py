"""One piece of a mask lowered by structure (fusedattn/_tile_schedule.py) through fusedattn's own
forward and backward, for the schedules whose pieces share rows and prefix-LM's (_flex_run.py): the
forward gives the piece's O and log-sum-exp, and the backward takes the O and statistics of the
whole rows, so that its softmax and dS are the whole row's, not the piece's.

A piece that fusedattn.torch's C++ path takes (no score function, or one whose only runtime values
are its scalars, on plain CUDA tensors outside compiled code) runs there, both passes with no
Python between it and the core (_torch_ops.forward_stats / backward); any other through the
operator bodies, one config a piece, printed once and kept for its backward (as context
parallelism's blocks do, _cp_blocks.py)."""
from ._call_config import config_text, plain_config_id
from ._bodies import backward_body
from ._fast_path import shared as fast_path
from ._operators import _backward_op, attend, eager_road
from ._tensors import Extras
from . import _score_mod


class FusedattnPiece:
    """A piece (a _tile_schedule.Piece) with its score function `fn` (None, or a score_mod or masked
    pair, over the view: _flex_views.Shifted where it reads positions), at `scale`, over bhsd views
    of q, k, v."""

    def __init__(self, piece, fn, scale):
        self.piece, self.fn, self.scale = piece, fn, scale
        self.call = None  # made by the forward: ("fast", module, config id, scalars) or (config, Extras, bias)

    def forward(self, q, k, v):
        """(O in q's dtype [b, h, rows, d_v], log-sum-exp float32 [b, h, rows])."""
        out = self._fast_forward(q, k, v)
        if out is not None:
            return out
        text, tensors, bias = ("", {}, None) if self.fn is None else _score_mod.prepare(self.fn, q, k, "bhsd")
        config = config_text(layout="bhsd", window=self.piece.window, align=self.piece.align, stats=True,
                             score_mod=text)
        self.call = (config, Extras(**tensors), None if bias is None else bias.detach().contiguous())
        o, stats, _ = attend(q, k, v, bias=self.call[2], sink=None, extras=self.call[1], config=config,
                             scale=self.scale, max_seqlen_q=0, max_seqlen_kv=0, needs_grad=False)
        return o, stats

    def fast_call(self, q, k, v):
        """(the C++ path's module, the piece's config id, its score function's scalars or None) where
        that path may take the piece over these views; else None."""
        fast = fast_path()
        if fast is None or not eager_road(q, k, v):
            return None
        mod = _score_mod.scalars_only(self.fn, q.device)
        if mod is None:
            return None
        config_id = plain_config_id("bhsd", False, tuple(self.piece.window), self.piece.align, False, "vanilla",
                                    False, mod[0])
        return fast, config_id, mod[1]

    def _fast_forward(self, q, k, v):
        """The forward on the C++ path, or None where it does not take the piece."""
        call = self.fast_call(q, k, v)
        if call is None:
            return None
        fast, config_id, scalars = call
        out = fast.forward_stats(q, k, v, config_id, self.scale, scalars)
        if out is NotImplemented:
            return None
        self.call = ("fast", fast, config_id, scalars)
        return out

    def backward(self, d_o, q, k, v, o, stats):
        """dQ, dK, dV of the piece's views, from the whole rows' O and statistics (dense copies: the
        core reads them as it allocates them)."""
        d_o, o, stats = d_o.contiguous(), o.contiguous(), stats.contiguous()
        if self.call[0] == "fast":
            _, fast, config_id, scalars = self.call
            return fast.backward(d_o, q, k, v, o, stats, config_id, self.scale, scalars)
        config, extras, bias = self.call
        if eager_road(q, k, v):
            d_q, d_k, d_v, _, _ = backward_body(d_o, q, k, v, o, stats, bias=bias, sink=None, extras=extras,
                                                config=config, scale=self.scale, max_seqlen_q=0, max_seqlen_kv=0)
        else:
            d_q, d_k, d_v, _, _ = _backward_op(d_o, q, k, v, o, stats, bias, None, extras.as_list(), config,
                                               self.scale, 0, 0)
        return d_q, d_k, d_v
