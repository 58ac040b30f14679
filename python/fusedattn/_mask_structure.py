"""FlexAttention masks that are one of cuDNN's own masks, read from their traced expression (the
core's text, fusedattn/score_mod.h), so that they run as cuDNN's band masks, which skip the tiles
they drop, instead of as conditions on every score, which compute the whole square. Framework-free.

    q_idx >= kv_idx                                   causal: window (-1, 0)
    (q_idx >= kv_idx) & (q_idx - kv_idx < W)          sliding window: (W, 0)
    (q_idx >= kv_idx) | (kv_idx < P)                  prefix-LM: rows < P see keys < P unmasked,
                                                      the rest causal (two calls over the rows)

Each is recognized in the forms users write (either side of a comparison, <= for < with W + 1, the
operands of & and | in either order); anything else is None and runs as conditions."""
import dataclasses
import re

_NUMBER = r"(\$\d+|-?\d+(?:\.\d+)?)"
_CAUSAL = ("ge(q,kv)", "le(kv,q)")
# q - kv < W, q - kv <= W (W + 1), kv > q - W, kv >= q - W (W + 1): the keys within W of the query.
_WITHIN = [(re.compile(rf"lt\(sub\(q,kv\),{_NUMBER}\)"), 0), (re.compile(rf"le\(sub\(q,kv\),{_NUMBER}\)"), 1),
           (re.compile(rf"gt\(kv,sub\(q,{_NUMBER}\)\)"), 0), (re.compile(rf"ge\(kv,sub\(q,{_NUMBER}\)\)"), 1),
           (re.compile(rf"gt\({_NUMBER},sub\(q,kv\)\)"), 0), (re.compile(rf"ge\({_NUMBER},sub\(q,kv\)\)"), 1)]
_PREFIX = [re.compile(rf"lt\(kv,{_NUMBER}\)"), re.compile(rf"gt\({_NUMBER},kv\)")]


@dataclasses.dataclass(frozen=True)
class Band:
    """cuDNN's band: keys j with i - left < j <= i (left -1: no left bound), top-left."""
    left: int


@dataclasses.dataclass(frozen=True)
class Prefix:
    """Prefix-LM: rows below `length` see the first `length` keys, the others are causal."""
    length: int


_INDICES = re.compile(r"(?<![\w$])(b|q|kv)(?![\w(])")


def reads_indices(text):
    """Whether a traced expression reads the batch, query or key index (directly or as a tensor's axis)."""
    return _INDICES.search(text) is not None


def _value(token, scalars):
    return float(scalars[int(token[1:])]) if token.startswith("$") else float(token)


def _whole(value):
    return int(value) if value == int(value) and value >= 1 else None


def _pair(condition, op):
    """The two operands of a top-level op(a,b) (and / or), or None."""
    if not (condition.startswith(op + "(") and condition.endswith(")")):
        return None
    inner, depth = condition[len(op) + 1:-1], 0
    for at, char in enumerate(inner):
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            return inner[:at], inner[at + 1:]
    return None


def _within(condition, scalars):
    for pattern, extra in _WITHIN:
        match = pattern.fullmatch(condition)
        if match:
            value = _whole(_value(match.group(1), scalars) + extra)
            return value
    return None


def structure(text, scalars):
    """Band, Prefix or None for a traced mask "select(<condition>,score,-inf)" and its scalars."""
    if not (text.startswith("select(") and text.endswith(",score,-inf)")):
        return None
    condition = text[len("select("):-len(",score,-inf)")]
    if condition in _CAUSAL:
        return Band(-1)
    both = _pair(condition, "and")
    if both and (both[0] in _CAUSAL or both[1] in _CAUSAL):
        other = both[1] if both[0] in _CAUSAL else both[0]
        window = _within(other, scalars)
        return Band(window) if window is not None else None
    either = _pair(condition, "or")
    if either and (either[0] in _CAUSAL or either[1] in _CAUSAL):
        other = either[1] if either[0] in _CAUSAL else either[0]
        for pattern in _PREFIX:
            match = pattern.fullmatch(other)
            if match:
                length = _whole(_value(match.group(1), scalars))
                return Prefix(length) if length is not None else None
    return None
