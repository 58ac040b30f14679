"""One piece of a mask lowered by structure (fusedattn/_tile_schedule.py) through fusedattn's own
forward and backward, for the schedules whose pieces share rows (_flex_run.py): the forward gives
the piece's O and log-sum-exp for the merge, and the backward takes the merged O and statistics of
the whole rows, so that its softmax and dS are the whole row's, not the piece's. One config a
piece, printed once and kept for its backward (as context parallelism's blocks do, _cp_blocks.py)."""
from ._call_config import config_text
from ._bodies import backward_body
from ._operators import _backward_op, attend, eager_road
from ._tensors import Extras
from . import _score_mod


class FusedattnPiece:
    """A piece (a _tile_schedule.Piece) with its score function `fn` (None, or a score_mod or masked
    pair, over the view: _flex_views.Shifted where it reads positions), at `scale`, over bhsd views
    of q, k, v."""

    def __init__(self, piece, fn, scale):
        self.piece, self.fn, self.scale = piece, fn, scale
        self.call = None  # (config, Extras, bias), made by the forward

    def forward(self, q, k, v):
        """(O in q's dtype [b, h, rows, d_v], log-sum-exp float32 [b, h, rows])."""
        text, tensors, bias = ("", {}, None) if self.fn is None else _score_mod.prepare(self.fn, q, k, "bhsd")
        config = config_text(layout="bhsd", window=self.piece.window, align=self.piece.align, stats=True,
                             score_mod=text)
        self.call = (config, Extras(**tensors), None if bias is None else bias.detach().contiguous())
        o, stats, _ = attend(q, k, v, bias=self.call[2], sink=None, extras=self.call[1], config=config,
                             scale=self.scale, max_seqlen_q=0, max_seqlen_kv=0, needs_grad=False)
        return o, stats

    def backward(self, d_o, q, k, v, o, stats):
        """dQ, dK, dV of the piece's views, from the whole rows' O and statistics (dense copies: the
        core reads them as it allocates them)."""
        config, extras, bias = self.call
        d_o, o, stats = d_o.contiguous(), o.contiguous(), stats.contiguous()
        if eager_road(q, k, v):
            d_q, d_k, d_v, _, _ = backward_body(d_o, q, k, v, o, stats, bias=bias, sink=None, extras=extras,
                                                config=config, scale=self.scale, max_seqlen_q=0, max_seqlen_kv=0)
        else:
            d_q, d_k, d_v, _, _ = _backward_op(d_o, q, k, v, o, stats, bias, None, extras.as_list(), config,
                                               self.scale, 0, 0)
        return d_q, d_k, d_v
