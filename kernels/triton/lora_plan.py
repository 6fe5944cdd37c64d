"""How the LoRA shrink/expand pair (kernels/triton/lora.py) is launched, in plain Python (no
torch, no triton: the engine's warm-up reads it to know the kernels' variants).

A decode step's LoRA rows are few (64 at most under the graphs) and every layer's work is
small, so a launch's cost is its latency, not its bytes: the first pair walked all of a row's
input columns in one program (48 dependent tile loads for down_proj's 3072) with 64 programs on
132 SMs. `split_k` cuts K into chunks of that many columns, one program each, its tiles
unrolled so their loads issue together; the expand sums the chunks' partial products as it
reads them (no atomics, no zeroing launch). `fused` puts both halves in one launch: each expand
program computes its row's shrink itself, redundant work for half the launches. `block_n` is
the expand's outputs per program. `overlap` (two launches only) runs the shrink on a side
stream beside the layer's base GEMM, which does not need its result: the pair's critical path
is then the expand alone (kernels/triton/lora.py, lora_linear_triton). `grouped` launches the
same forms over tiles of up to GROUP_ROWS rows of one adapter (kernels/triton/lora_grouped.py,
vLLM's SGMV form: tile products, each adapter's weights read once a tile, not once a row;
the step's tiles come from kernels/reference/lora_tiles.py). Which wins is a GPU's
to say: benchmarks/bench_lora_kernels.py times them under CUDA graphs and
benchmarks/lora_tune.py writes the pick per architecture into lora_tuned.py.
KVDECK_LORA_KERNEL (`split_k=256,block_n=128,fused=0,num_warps=4,overlap=0,grouped=0`, any subset)
overrides the pick in a process.
"""

import os
from dataclasses import dataclass, fields, replace

from kvdeck.kernels.triton.lora_tuned import TUNED


@dataclass(frozen=True, slots=True)
class LoRAKernelConfig:
    split_k: int = 256  # input columns per shrink program (0: one program walks all of K)
    block_n: int = 128  # output columns per expand program
    fused: bool = False  # one launch: each expand program computes its row's shrink
    num_warps: int = 4
    overlap: bool = False  # the shrink on a side stream, beside the base GEMM (two launches only)
    grouped: bool = False  # programs over tiles of one adapter's rows (lora_grouped.py), not per row

    def __post_init__(self) -> None:
        for name in ("split_k", "block_n", "num_warps"):
            value = getattr(self, name)
            if value < 0 or (value & (value - 1)) or (value == 0 and name != "split_k"):
                raise ValueError(f"LoRA kernel {name} must be a power of two, got {value}")
        if 0 < self.split_k < 16 or self.block_n < 16:
            raise ValueError(f"LoRA kernel split_k (0 or >= 16) and block_n (>= 16) too small: {self}")
        if self.overlap and self.fused:
            raise ValueError("LoRA kernel overlap runs the shrink beside the base GEMM: "
                             "it needs the two-launch form (fused=0)")

    def num_splits(self, in_size: int) -> int:
        """How many shrink programs share one row's input columns (the expand's partials)."""
        if self.fused or self.split_k == 0:
            return 1
        return -(-in_size // self.split_k)

    def label(self) -> str:
        return ",".join(f"{f.name}={int(getattr(self, f.name))}" for f in fields(self))


DEFAULT_CONFIG = LoRAKernelConfig()
ENV = "KVDECK_LORA_KERNEL"
GROUP_ROWS = 16  # the grouped kernels' tile of rows (a tile product's smallest side)
BOOL_FIELDS = ("fused", "overlap", "grouped")


def parse_config(text: str, base: LoRAKernelConfig = DEFAULT_CONFIG) -> LoRAKernelConfig:
    """`split_k=256,block_n=128,fused=0,num_warps=4,overlap=0,grouped=0` (any subset, over `base`)."""
    names = {f.name for f in fields(LoRAKernelConfig)}
    values: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise ValueError(f"{ENV}: {item!r} is not one of {sorted(names)} = an integer")
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{ENV}: {name} must be an integer, got {value!r}") from None
        values[name] = bool(number) if name in BOOL_FIELDS else number
    return replace(base, **values)


def _tuned(arch: int | None) -> LoRAKernelConfig:
    entry = TUNED.get(arch) if arch is not None else None
    return LoRAKernelConfig(**entry["config"]) if entry else DEFAULT_CONFIG


_CHOSEN: dict[int | None, LoRAKernelConfig] = {}


def lora_kernel_config(arch: int | None) -> LoRAKernelConfig:
    """The config for an SM version (None: off CUDA): KVDECK_LORA_KERNEL over the committed
    pick (lora_tuned.py) over the defaults; read once per process and architecture."""
    if arch not in _CHOSEN:
        override = os.environ.get(ENV, "").strip()
        _CHOSEN[arch] = parse_config(override, _tuned(arch)) if override else _tuned(arch)
    return _CHOSEN[arch]


def use_config(arch: int | None, config: LoRAKernelConfig) -> None:
    """Serve `arch` with `config` in this process (the kernel bench times its candidates so)."""
    _CHOSEN[arch] = config
