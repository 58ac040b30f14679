"""Tensors in the core's terms: (dtype, sizes, strides) views, device addresses, the extra tensors a
call carries beside q, k, v, bias and sink (Extras). The core describes the tensors themselves, and
gives the outputs' shapes (_config.output_shapes)."""
from typing import Optional

from torch import Tensor

from .. import _config, _fp8_cache
from ..errors import invalid_argument


EMPTY = (0,)  # the operators return an empty tensor for an output not asked for


def view(t: Tensor):
    """A tensor as the core takes it: (dtype name, sizes, strides)."""
    return str(t.dtype)[len("torch."):], tuple(t.shape), t.stride()


def address(t: Optional[Tensor]) -> int:
    """A tensor's device address, 0 where it is absent or empty."""
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


class Extras:
    """The tensors a call may carry beside q, k, v, bias and sink; none of them differentiable. They
    travel through the operators as one list in this order (mod_*: a score modifier's scalars and
    tensors; descale_*: an FP8 K/V cache's, _fp8_cache.py)."""
    NAMES = ("rng", "cu_seqlens_q", "cu_seqlens_kv", "seq_len_q", "seq_len_kv", "page_table_k", "page_table_v",
             "mod_scalars", "mod_t0", "mod_t1", "mod_t2", "mod_t3", "descale_k", "descale_v")
    __slots__ = NAMES

    def __init__(self, **tensors):
        for name in self.NAMES:
            setattr(self, name, tensors.get(name))

    @classmethod
    def of(cls, tensors):
        """The Extras of the operators' list."""
        return cls(**dict(zip(cls.NAMES, tensors)))

    def as_list(self):
        return [getattr(self, name) for name in self.NAMES]

    def sequences(self):
        return self.cu_seqlens_q.numel() - 1 if self.cu_seqlens_q is not None else (
            self.page_table_k.shape[0] if self.page_table_k is not None else 0)

    def addresses(self):
        """The tensor set's fields these fill, as device addresses (0 where absent)."""
        rng = self.rng
        out = dict(seq_len_q=address(self.seq_len_q), seq_len_kv=address(self.seq_len_kv),
                   cu_seqlens_q=address(self.cu_seqlens_q), cu_seqlens_kv=address(self.cu_seqlens_kv),
                   sequences=self.sequences() if self.cu_seqlens_q is not None else 0,
                   dropout_seed=address(rng),
                   dropout_offset=address(rng) + rng.element_size() if rng is not None else 0)
        if self.mod_scalars is not None or self.mod_t0 is not None:
            out.update(score_mod_scalars=address(self.mod_scalars),
                       score_mod_tensors=[address(self.mod_t0), address(self.mod_t1), address(self.mod_t2),
                                          address(self.mod_t3)])
        if self.descale_k is not None:
            out.update(descale_k=address(self.descale_k), descale_v=address(self.descale_v))
        return out

    def check_lengths_and_tables(self, spec):
        """A paged call's tables and lengths, and a dense call's runtime lengths, have the spec's
        sequences, in int32 (the core reads them by address): _config.require_paged_arrays and
        require_lengths, shared with fusedattn.jax."""
        if self.page_table_k is not None:
            _config.require_paged_arrays(spec, page_table_k=self.page_table_k, page_table_v=self.page_table_v,
                                         seq_len_kv=self.seq_len_kv, seq_len_q=self.seq_len_q)
        elif self.seq_len_kv is not None or self.seq_len_q is not None:
            _config.require_lengths(spec, seq_len_q=self.seq_len_q, seq_len_kv=self.seq_len_kv)

    def check_fp8_cache_descales(self, spec, fp8_scaling):
        """An FP8 K/V cache's descales fit the spec (_fp8_cache.require_descales, shared with
        fusedattn.jax); the core says whether the cache's dtype is one."""
        if self.descale_k is not None:
            _fp8_cache.require_descales(spec, fp8_scaling, self.descale_k, self.descale_v)

    def check_score_mod_tensors(self, spec):
        """Each tensor a score modifier captured has the shape its axes span in this call (the core
        says which)."""
        for slot in range(4):
            tensor = getattr(self, f"mod_t{slot}")
            if tensor is None:
                break
            want = tuple(spec.score_mod_tensor_shape(slot))
            if tuple(tensor.shape) != want:
                raise invalid_argument(f"score_mod.t{slot}.shape", tuple(tensor.shape),
                                       f"shape {want}, the sizes its indices span in this call")
