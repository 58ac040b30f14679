"""Transformer blocks with fusedattn inside, for the compile tests: on meta tensors without a GPU,
and against eager on the GPU."""
import torch

import fusedattn.torch as fa


class Block(torch.nn.Module):
    """LayerNorm, the QKV projection, causal attention (bshd), the output projection, the residual."""

    def __init__(self, dim=128, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        return x + self.out(fa.attention(q, k, v, layout="bshd", causal=True).reshape(b, s, dim))


class Fp8Block(torch.nn.Module):
    """Block's attention in FP8 (fp8_attention with the block's state), no LayerNorm. Head dim 128:
    Hopper's FP8 backward takes no other (test_torch_fp8_gpu.py runs it on the GPU)."""

    def __init__(self, dim=256, heads=2, backward="fp8", state=None):
        super().__init__()
        self.heads, self.backward = heads, backward
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.state = state or fa.Fp8State("delayed", history=4, device="meta")

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        o = fa.fp8_attention(q, k, v, self.state, causal=True, backward=self.backward)
        return x + self.out(o.reshape(b, s, dim))
