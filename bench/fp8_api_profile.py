"""bench/fp8_api_profile.py — where an FP8 call's GPU time goes, for run_bench_fp8_api.py: its kernels
over a few calls from torch.profiler (harness.kernel_times), split into cuDNN's attention kernels
and everything else: fusedattn's quantize, dequantize, amax and scale kernels, the K/V expansion of
a grouped FP8 backward, PyTorch's fills and copies, memsets. That rest is what FP8 costs beyond the
attention itself: the quantization and the recipe's bookkeeping."""
import re

import torch

from harness import kernel_times, short

# cuDNN's attention kernels, by name: its runtime-compiled SDPA kernels are cudnn_generated_* (on
# Hopper cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_..., ..._bprop_...), its
# precompiled fused-attention engines fmha_*. A name from fusedattn's namespace, PyTorch's,
# Inductor's or the driver's (memsets, copies) is never attention, whatever else it contains.
_CUDNN = re.compile(r"cudnn|sdpa|fmha|fprop|bprop", re.IGNORECASE)
_NOT_CUDNN = re.compile(r"fusedattn::|\bat::|\bc10::|triton_|^Memset|^Memcpy")

# Names each side of the line, checked by --dry-run (a changed pattern that misfiles one fails).
SAMPLES = {
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0": True,
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x1x1_kernel0_0": True,
    "fmha_v2_flash_attention_e4m3_fp32_128_128_S_qkv_128_causal_sm90_kernel": True,
    "void fusedattn::(anonymous namespace)::quantize_kernel<__nv_bfloat16, __nv_fp8_e4m3>(Strided, ...)": False,
    "void fusedattn::(anonymous namespace)::delayed_scaling_kernel(float const*, float*, long, float const*)": False,
    "void fusedattn::(anonymous namespace)::expand_kernel<unsigned char>(Strided, Strided, ChunkedShape, long)": False,
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >": False,
    "Memset (Device)": False,
    "Memcpy DtoD (Device -> Device)": False,
    "triton_poi_fused_0": False,
}


def is_attention(name):
    return bool(_CUDNN.search(name)) and not _NOT_CUDNN.search(name)


def misfiled_samples():
    """The SAMPLES the patterns put on the wrong side (none when they hold)."""
    return [name for name, attention in SAMPLES.items() if is_attention(name) != attention]


def short_name(name, width=100):
    """A kernel's name without its parameter list and anything past `width` characters (a demangled
    function's: "void f<...>(...)"; the driver's "Memset (Device)" stays whole)."""
    if name.startswith("void "):
        name = name.removeprefix("void ").replace("(anonymous namespace)", "{anon}").split("(")[0]
    return name[:width]


def split(kernels, top=5):
    """harness.kernel_times' (name, launches a call, ms a call) split into cuDNN's attention and the
    rest: ms a call of each, the rest's share of the total, and the rest's `top` kernels."""
    attention = [k for k in kernels if is_attention(k[0])]
    other = [k for k in kernels if not is_attention(k[0])]
    total = sum(ms for _, _, ms in kernels)
    other_ms = sum(ms for _, _, ms in other)
    return dict(total_ms=total, attention_ms=total - other_ms, other_ms=other_ms,
                other_share=other_ms / total if total else None,
                attention_kernels=[dict(name=short_name(n), launches=c, ms=ms) for n, c, ms in attention],
                top_other=[dict(name=short_name(n), launches=c, ms=ms) for n, c, ms in other[:top]],
                other_kernels=len(other))


def profile(steps, calls):
    """{name: split(...) or an error's text} of each of `steps` (name -> a zero-argument call that
    enqueues one step), each over `calls` calls after harness.kernel_times' warm-up."""
    out = {}
    for name, step in steps.items():
        try:
            out[name] = split(kernel_times(step, steps=calls))
        except Exception as error:  # noqa: BLE001  (one failing step hides none of the others)
            out[name] = short(error)
        torch.cuda.synchronize()
    return out


def markdown(profiles, target):
    """Markdown lines: per shape, the share of each profiled call, and the FP8 step's top kernels
    outside attention. `profiles`: {shape key: profile(...)}; the first step of each is the one
    held against `target` (the largest share of GPU time the rest may take)."""
    lines = ["| shape | call | GPU ms a call | cuDNN attention ms | the rest ms | the rest's share |",
             "|---|---|---|---|---|---|"]
    tops = []
    for key, steps in profiles.items():
        for i, (name, result) in enumerate(steps.items()):
            if isinstance(result, str):
                lines.append(f"| {key} | {name} | {result} | | | |")
                continue
            share = result["other_share"]
            mark = "" if i or share is None else (" ✓" if share <= target else " ✗")
            if not result["attention_kernels"]:
                mark += " (no kernel recognized as cuDNN's attention: the split is not meaningful)"
            lines.append(f"| {key} | {name} | {result['total_ms']:.3f} | {result['attention_ms']:.3f} | "
                         f"{result['other_ms']:.3f} | {'–' if share is None else f'{share:.1%}'}{mark} |")
            if i == 0:
                tops.append(f"- {key}: quantization and bookkeeping: {'–' if share is None else f'{share:.1%}'} of "
                            f"the FP8 step's GPU time ({name}; target ≤ {target:.0%}){mark}; its top kernels "
                            "outside attention, ms a call (launches):")
                tops += [f"  - {k['ms']:.3f} ({k['launches']}) `{k['name']}`" for k in result["top_other"]]
    return lines + [""] + tops
