#!/usr/bin/env python3
"""What a kernel's main loop costs, read from its SASS with no GPU: for each kernel of an object file
whose mangled name contains every given word, its registers and the instructions of its longest
loop (the widest backward branch), by kind (copies into shared memory, tensor-core products,
barriers, conversions). For comparing a kernel's loop before and after a change; the counts are
static (each path of a branch counted once), not what a warp issues.

    python3 scripts/kernel_loop_sass.py build/CMakeFiles/fusedattn.dir/src/exec/decode_kernel.cu.o \\
        decode_kernel bfloat16S3_Li128ELi1ELi4 [--arch sm_90]

Needs cuobjdump and nvdisasm on the PATH (the CUDA toolkit's; without one, PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels carry them under nvidia/cu13/bin).
"""
import argparse
import re
import shutil
import subprocess
import sys

ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"BRA (?:!?U?P\w+, )?0x([0-9a-f]+)")
KINDS = {
    "async copies (LDGSTS)": r"LDGSTS",
    "tensor-core products (HMMA)": r"HMMA",
    "block barriers": r"BAR\.SYNC",
    "warp barriers": r"WARPSYNC",
    "shared loads (LDS, LDSM)": r"LDS|LDSM",
    "conversions (F2F, F2FP)": r"F2FP?\b",
    "integer multiplies (IMAD)": r"IMAD",
    "branches": r"BRA",
}


def functions(sass):
    """{mangled name: [(address, instruction)]} of a cuobjdump -sass listing."""
    out = {}
    for block in sass.split("Function : ")[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = [(int(m.group(1), 16), m.group(2)) for m in ADDRESS.finditer(body)]
    return out


def longest_loop(instructions):
    """The instructions between the widest backward branch and its target, or [] without one."""
    widest = None
    for address, text in instructions:
        branch = BRANCH.search(text)
        if branch and int(branch.group(1), 16) < address:
            span = (int(branch.group(1), 16), address)
            if widest is None or span[1] - span[0] > widest[1] - widest[0]:
                widest = span
    return [] if widest is None else [text for address, text in instructions if widest[0] <= address <= widest[1]]


def registers(obj, arch, cuobjdump):
    """{mangled name: registers a thread}."""
    listing = subprocess.run([cuobjdump, "-res-usage", "-arch", arch, obj], capture_output=True, text=True, check=True)
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"Function (\S+):\s*\n\s*REG:(\d+)", listing.stdout)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("object", help="an object file or executable with device code")
    parser.add_argument("words", nargs="+", help="words the kernel's mangled name contains")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None or shutil.which("nvdisasm") is None:
        sys.exit("kernel_loop_sass: cuobjdump and nvdisasm must be on the PATH (see this script's docstring)")
    sass = subprocess.run([cuobjdump, "-sass", "-arch", args.arch, args.object], capture_output=True, text=True,
                          check=True).stdout
    regs = registers(args.object, args.arch, cuobjdump)
    found = {name: body for name, body in functions(sass).items() if all(word in name for word in args.words)}
    if not found:
        sys.exit(f"kernel_loop_sass: no kernel's name contains all of {args.words}")
    for name, body in found.items():
        loop = longest_loop(body)
        print(f"{name}\n  {regs.get(name, '?')} registers, {len(body)} instructions, main loop {len(loop)}")
        for kind, pattern in KINDS.items():
            count = sum(1 for text in loop if re.match(rf"(@!?U?P\w+\s+)?({pattern})", text))
            print(f"    {kind}: {count}")


if __name__ == "__main__":
    main()
