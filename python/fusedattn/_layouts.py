"""Arrays to the core's terms, for every adapter: logical [b, h, s, d] dims and element strides
per layout, and tensor descriptors in the spec string's form. Framework-free."""

# Per layout, the array axis that holds each logical axis (batch, heads, sequence, head dim).
AXES = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}
DTYPES = {"float16": "f16", "bfloat16": "bf16"}


def row_major_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def logical(shape, strides, layout, batch=0, max_seq=0):
    """Logical [b, h, s, d] dims and strides of an array in `layout`; ragged ("thd", [t, h, d]) gets
    `batch` sequences of up to `max_seq` tokens and a batch stride of 0."""
    if layout == "thd":
        return (batch, shape[1], max_seq, shape[2]), (0, strides[1], strides[0], strides[2])
    axes = AXES[layout]
    return tuple(shape[a] for a in axes), tuple(strides[a] for a in axes)


def desc(dtype, dims_strides):
    """A tensor in the spec string's form: dtype[dims]/[strides]."""
    dims, strides = dims_strides
    return f"{dtype}[{','.join(map(str, dims))}]/[{','.join(map(str, strides))}]"
