"""The PyTorch FP8 GPU tests' problems: random inputs, the same quantized to FP8 by current scaling
(as plain FP8 tensors with descales, or as Fp8Tensors) with the values they hold, and a training step
captured in a CUDA graph."""
import torch

import fusedattn.torch as fa


def inputs(b=2, s=256, h=4, d=128, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.rand(b, s, h, d, device="cuda", generator=generator) * 2 - 1).to(torch.bfloat16).requires_grad_()
            for _ in range(3)]

def quantized(x, dtype=torch.float8_e4m3fn):
    """x in FP8 by current scaling, as an FP8 projection hands it on: (x8, descale [1])."""
    scale = torch.finfo(dtype).max / x.detach().abs().max().float()
    return (x.detach().float() * scale).to(dtype), (1.0 / scale).reshape(1)


def fp8_problem(layout, seed, dtype=torch.float8_e4m3fn):
    q, k, v = inputs(seed=seed)
    if layout == "sbhd":
        q, k, v = (t.detach().transpose(0, 1).contiguous() for t in (q, k, v))
    pairs = [quantized(t, dtype) for t in (q, k, v)]
    values = [x8.float() * descale for x8, descale in pairs]  # what the FP8 tensors hold
    return [x8 for x8, _ in pairs], tuple(descale for _, descale in pairs), values


def captured_training_step(static, state, d_o):
    """(graph, O): a causal fp8_attention forward and backward on `static` captured in a CUDA graph,
    after two eager steps on a side stream (which build the plans and calibrate the state)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fa.fp8_attention(*static, state, causal=True).backward(d_o)
    torch.cuda.current_stream().wait_stream(side)
    for t in static:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.fp8_attention(*static, state, causal=True)
        out.backward(d_o)
    return graph, out

def fp8_tensors(layout, seed, dtype=torch.float8_e4m3fn):
    """Fp8Tensor leaves of fresh FP8 payloads and their descales, and their values in float32."""
    payloads, descales, values = fp8_problem(layout, seed, dtype)
    leaves = [fa.Fp8Tensor(x8, d, torch.bfloat16, requires_grad=True) for x8, d in zip(payloads, descales)]
    return leaves, values
