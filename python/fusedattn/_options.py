"""Call options in the spec string's terms, for every adapter: the options text and the bias kind
of a bias shape. Framework-free."""
from .errors import invalid_argument

# Bias kinds by which of (batch, heads, query rows) the bias has rather than broadcasts; the core
# takes these five (fusedattn/spec.h).
_BIAS_KINDS = {(True, True, True): "bhss", (True, False, True): "b1ss", (False, True, True): "1hss",
               (False, False, True): "11ss", (False, False, False): "111s"}


def bias_kind(shape, b, h, s_q, s_kv):
    """The spec's bias kind for a bias of shape [b|1, h|1, s_q|1, s_kv] (a size-1 dim broadcasts)."""
    shape = tuple(shape)
    full = (len(shape) == 4 and shape[0] in (1, b) and shape[1] in (1, h) and shape[2] in (1, s_q)
            and shape[3] == s_kv)
    if not full:
        raise invalid_argument("bias.shape", shape, f"[b|1, h|1, s_q|1, s_kv] = [{b}|1, {h}|1, {s_q}|1, {s_kv}]")
    kind = _BIAS_KINDS.get((shape[0] > 1, shape[1] > 1, shape[2] > 1))
    if kind is None:  # e.g. [b, h, 1, s_kv]: expand it to the query rows
        raise invalid_argument("bias.shape", shape,
                               "one of [b,h,s_q,s_kv], [b,1,s_q,s_kv], [1,h,s_q,s_kv], [1,1,s_q,s_kv], [1,1,1,s_kv]")
    return kind


def options_text(left, right, align, softmax, bias_kind, alibi, deterministic, padding, dropout, max_logit):
    """The spec string's options for a call's arguments (window, mask alignment, softmax variant,
    bias kind, ALiBi, determinism, runtime lengths, dropout probability, max logit)."""
    options = [f"window={left},{right}", f"align={align}", f"softmax={softmax}"]
    if bias_kind != "none":
        options.append(f"bias={bias_kind}")
    if alibi:
        options.append("alibi=1")
    if deterministic:
        options.append("deterministic=1")
    if padding:
        options.append("padding=1")
    if dropout > 0.0:
        options.append(f"dropout={dropout!r}")
    if max_logit:
        options.append(f"max_logit={max_logit}")
    return " ".join(options)
