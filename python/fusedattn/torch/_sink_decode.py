"""A learnable sink in a decode step (softmax="sink" with one query row a sequence), which cuDNN's
decode-only mode refuses ("decode only mode, i.e. s_q == 1, not supported with sink_token", cuDNN
9.19 on the H200). Eager, the core runs it on fusedattn's decode kernel, which adds the sink to
each row's denominator itself; a call the kernel does not take (the core refuses it, saying why),
and every such call in compiled code (whose operator cannot ask), runs here: the vanilla call with
its statistics, and the sink joined to every row by the one merge (fusedattn/_merge.py), as context
parallelism joins it: a partial of no value whose log-sum-exp is sink[h]. Exact, since the sink is
one more term of each row's softmax denominator. Inference only: a call that needs gradients, the
max logit, or the statistics of padded rows (which the merge would give the sink's value, not -inf)
takes the one call as before."""
import torch

from .. import _merge

# The axis of q's rows in each dense layout.
_ROW_AXIS = {"bshd": 1, "sbhd": 0, "bhsd": 2}


def applies(q, layout, *, softmax, needs_grad, return_stats, return_max_logit, seq_len_q):
    """Whether attention() runs this call as the vanilla call joined with its sink."""
    axis = _ROW_AXIS.get(layout)
    return (softmax == "sink" and axis is not None and q.shape[axis] == 1 and not needs_grad and
            not return_max_logit and not (return_stats and seq_len_q is not None))


def _as_bshd(x, layout):
    return x.transpose(0, 1) if layout == "sbhd" else x.transpose(1, 2) if layout == "bhsd" else x


def join_sink(o, stats, sink, layout):
    """(O, statistics) of the call with the sink: `o` in `layout` and `stats` [b, h, s_q] of the
    vanilla call, merged with the sink's partial (O 0, log-sum-exp sink[h])."""
    rows = _as_bshd(o, layout)
    wide = torch.promote_types(torch.float32, o.dtype)
    sink_part = (torch.zeros_like(rows, dtype=wide), sink.to(wide).view(1, -1, 1).expand(stats.shape))
    merged, lse = _merge.merge((rows.to(wide), stats.to(wide)), sink_part, torch)
    return _as_bshd(merged, layout).to(o.dtype), lse.to(stats.dtype)


def run(attention, q, k, v, sink, *, layout, return_stats, **options):
    """attention(...) with softmax="sink" as the vanilla call (the same `options`) joined with `sink`."""
    o, stats = attention(q, k, v, layout=layout, softmax="vanilla", return_stats=True, **options)
    o, stats = join_sink(o, stats, sink, layout)
    return (o, stats) if return_stats else o
