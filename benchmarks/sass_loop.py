"""The machine code of a compiled kernel's main loop, without a GPU: a cubin disassembled by the
nvdisasm Triton ships, its largest loop (a backward branch and its target) counted by opcode.

compile_for_gpu.py reports it for the W4A16 GEMMs on sm_90 as instructions per weight per
thread: how much a thread issues for each weight it dequantises and multiplies. An SM issues
at most 4 warp instructions a cycle (128 thread instructions); the H200 streams about 37
4-bit weights a cycle per SM (4.8 TB/s over 132 SMs at 1.98 GHz), so a K loop above about
3.5 instructions per weight is bound by issue before bandwidth. The W4A16 issue's diagnosis
of the AWQ-layout kernel (shift, mask, subtract, convert, multiply, convert per weight) is
this figure.
"""

import collections
import os
import re
import subprocess
import tempfile

import triton

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
_LABEL = re.compile(r"\s*(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?(\.L_x_\d+)")
_PREDICATE = re.compile(r"^@!?U?P[T\d]+\s+")


def instructions(cubin: bytes) -> tuple[list[str], dict[str, int]]:
    """The cubin's instructions in order and each label's index among them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([NVDISASM, "-c", file.name], capture_output=True, text=True,
                              check=True).stdout
    listing, labels = [], {}
    for line in text.splitlines():
        if label := _LABEL.match(line):
            labels[label.group(1)] = len(listing)
        elif instruction := _INSTRUCTION.match(line):
            listing.append(instruction.group(1))
    return listing, labels


_MULTIPLY = re.compile(r"\b(FFMA|FMUL|HFMA2|HMUL2)\b")
# ptxas zeroes a register with a multiply-add of zeros (`HFMA2.MMA R3, -RZ, RZ, 0, 0`): a move.
_ZEROING = re.compile(r"\bHFMA2(\.MMA)?\s+R\d+,\s*-?RZ,\s*RZ\b")


def loads_before_first_multiply(cubin: bytes) -> tuple[int, int]:
    """(global loads issued before the first floating-point multiply, all global loads): a
    kernel whose tiles' loads all come first has them in flight together."""
    listing, _ = instructions(cubin)
    first = next((i for i, instruction in enumerate(listing)
                  if _MULTIPLY.search(instruction) and not _ZEROING.search(instruction)), len(listing))
    loads = [i for i, instruction in enumerate(listing) if "LDG" in instruction]
    return sum(1 for i in loads if i < first), len(loads)


def largest_loop(cubin: bytes) -> collections.Counter:
    """Opcodes (with modifiers, predicates dropped) of the largest loop's body, by count."""
    listing, labels = instructions(cubin)
    bodies = [listing[labels[branch.group(1)]:end + 1] for end, instruction in enumerate(listing)
              if (branch := _BRANCH.search(instruction)) and labels.get(branch.group(1), end + 1) <= end]
    body = max(bodies, key=len, default=[])
    return collections.Counter(_PREDICATE.sub("", instruction).split()[0] for instruction in body)
