"""Meta tensors for the PyTorch tests that run without a GPU: shapes, strides and dtypes only, through
the operators' fake implementations."""
import torch


def meta(*shape, dtype=torch.bfloat16, grad=True):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)
