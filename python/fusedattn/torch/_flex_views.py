"""A score function over a view of the problem: the pieces of a mask lowered by structure
(fusedattn/_tile_schedule.py) run over query rows [r0, r1) and keys [c0, c1), where the call numbers
its indices from 0, while the function (a FlexAttention score_mod, a mask_mod as conditions) means
positions of the whole problem. Shifted is that function moved to the view's origin, and shift()
moves its trace there: q_idx becomes add(q, r0) and kv_idx add(kv, c0) (the offsets runtime
scalars, so every view of one size shares a plan), and each tensor read at q_idx or kv_idx is cut
to the view's rows or keys (t[q] over the view is t[r0:r1][q]), so a document table is still read at
plain indices (a gather, t[add(q, r0)], could not stay in a mask). Tracing the moved function itself
would give that gather; the trace is moved instead (fusedattn.torch._score_mod.traced)."""
import functools
import re

from .. import _score_mod

# A tensor leaf (its axes stay as they are: the tensor is cut instead), or a bare q or kv index.
_TOKENS = re.compile(r"t\d+\[[^\]]*\]|(?<![\w$])(q|kv)(?![\w(\[])")


class Shifted:
    """`inner` (score, b, h, q_idx, kv_idx) -> score over the view rows [rows) x keys [keys): called
    with the view's indices, it calls `inner` with the whole problem's (the meaning; fusedattn's
    calls take shift()'s trace of it)."""

    def __init__(self, inner, rows, keys):
        self.inner, self.rows, self.keys = inner, tuple(rows), tuple(keys)

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.inner(score, b, h, q_idx + self.rows[0], kv_idx + self.keys[0])

    def __repr__(self):
        return f"Shifted({self.inner!r}, rows={self.rows}, keys={self.keys})"


@functools.lru_cache(maxsize=1024)
def shifted(inner, rows, keys):
    """The Shifted of `inner` over this view, one object per view (so that it is traced once)."""
    return Shifted(inner, rows, keys)


def shift(traced, rows, keys):
    """The Traced of a function over the whole problem, moved to the view rows [rows) x keys [keys):
    its modifier and its bias part. Beside a bias the modifier's numbers are written out (fusedattn
    /_score_mod.py's finish() says why), and so are the offsets there."""
    moved = _shift_part(traced, rows, keys, written=traced.bias is not None)
    if traced.bias is not None:
        moved.bias = _shift_part(traced.bias, rows, keys, written=False)
    return moved


def _shift_part(part, rows, keys, *, written):
    scalars, offsets = list(part.scalars), {}

    def token(match):
        name = match.group(1)
        start = {"q": rows[0], "kv": keys[0]}.get(name, 0)
        if start == 0:  # a tensor leaf, or an index whose view starts where the whole does
            return match.group(0)
        if name not in offsets and written:
            offsets[name] = repr(float(start))
        elif name not in offsets:
            scalars.append(float(start))
            offsets[name] = f"${len(scalars) - 1}"
        return f"add({name},{offsets[name]})"
    text = _TOKENS.sub(token, part.text)
    tensors = [_cut(tensor, axes, rows, keys) for tensor, axes in zip(part.tensors, part.axes)]
    return _score_mod.Traced(text, scalars, tensors, part.axes)


def _cut(tensor, axes, rows, keys):
    """A tensor read at `axes` ("b,h,q,kv" or fewer; "" for one only gathered from), cut to the view
    along its q and kv axes."""
    names = axes.split(",") if axes else []
    if "q" not in names and "kv" not in names:
        return tensor
    return tensor[tuple(slice(*rows) if name == "q" else slice(*keys) if name == "kv" else slice(None)
                        for name in names)]
