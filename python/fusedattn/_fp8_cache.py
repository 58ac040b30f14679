"""FP8 K/V caches beside 16-bit queries (the core's AttentionSpec::fp8_kv_cache), as serving code
keeps them: the pools in E4M3 and the float32 descales that bring them back, K ~ k_cache *
descale_k and V ~ v_cache * descale_v, one for the whole cache or one a K/V head. Both adapters'
paged_attention ask here which fp8_scaling the call's config takes and whether the descales fit
its spec, so the two refuse a wrong call in the same words; the core checks the dtypes (E4M3 caches
only) and says where an FP8 cache runs (support.kernel)."""
from ._config import dims, dtype_name
from .errors import invalid_argument

_NAMES = ("descale_k", "descale_v")


def _is_fp8(x):
    # itemsize first: a 16-bit cache, the common call, costs one attribute read here.
    return x.dtype.itemsize == 1 and dtype_name(x).startswith("float8")


def _size(x):
    size = 1
    for n in x.shape:
        size *= n
    return size


def scaling(k_cache, v_cache, descale_k, descale_v):
    """The config's fp8_scaling for a call over these caches: "" for 16-bit caches (which take no
    descales), "tensor" for descales of one element, "head" for descales of one a K/V head."""
    descales = (descale_k, descale_v)
    if not (_is_fp8(k_cache) or _is_fp8(v_cache)):
        for name, d in zip(_NAMES, descales):
            if d is not None:
                raise invalid_argument(name, "given",
                                       f"an FP8 (float8_e4m3fn) K/V cache; k_cache is {dtype_name(k_cache)}")
        return ""
    for name, d in zip(_NAMES, descales):
        if d is None:
            raise invalid_argument(name, None, "float32 descales with an FP8 K/V cache (K = k_cache * descale_k): "
                                               "one element, or one for each K/V head")
    return "head" if any(_size(d) > 1 for d in descales) else "tensor"


def require_descales(spec, fp8_scaling, descale_k, descale_v):
    """The descales of an FP8 cache's call (scaling() said fp8_scaling): float32, of one element
    ("tensor") or [h_kv] ("head") both, h_kv the spec's K/V heads."""
    heads = spec.heads_kv
    for name, d in zip(_NAMES, (descale_k, descale_v)):
        if dtype_name(d) != "float32":
            raise invalid_argument(f"{name}.dtype", dtype_name(d), "float32")
        if fp8_scaling == "head" and tuple(d.shape) != (heads,):
            raise invalid_argument(f"{name}.shape", dims(d.shape),
                                   f"[{heads}], a descale for each of the cache's {heads} K/V heads, as the other "
                                   "descale has (or one element each)")
        if fp8_scaling == "tensor" and len(d.shape) > 1:
            raise invalid_argument(f"{name}.shape", dims(d.shape), "one element ([] or [1]), or [h_kv]")
