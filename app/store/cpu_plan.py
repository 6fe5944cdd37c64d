"""What the CPU engine will do with a model on this machine, worked out from light facts
(/proc/cpuinfo's flags, config.json, safetensors headers) without importing torch, so that
the Models screen can say it: the dtype engine/runner/device.py's `resolve_dtype` picks,
whether INT4 layers become the INT4 kernels' tiles (kernels/cpu/int4.py) and the output head
int8 (kernels/cpu/int8.py), the copies the bf16 path keeps, and so the bytes the weights and
one sequence's KV cache take.

The rules mirror the engine's, each where it is decided:
- dtype (resolve_dtype, with dtype and attention_backend "auto"): bfloat16 where torch's oneDNN
  does bf16 (`bf16_packing_supported`: AVX-512 BW/VL/DQ, torch's own check) for a bf16
  checkpoint, and for an AWQ/GPTQ one where the INT4 kernels exist too; else float32;
- INT4 kernels (build.int4_isa): the native build (x86-64, a C compiler, not
  KVDECK_CPU_NATIVE=0) with AVX-512 VNNI+BW or AVX2+FMA+F16C; an INT4 layer of group 32/64/128
  whose width is a multiple of 8 is repacked into tiles (4 bits a weight, and per group and
  column an fp16 scale, a u8 zero and a spare byte), its AutoAWQ tensors dropped;
- the output head of an INT4 model on such a CPU: int8 tiles (1 + 1/16 bytes a weight) beside
  the dense weight it keeps (quant/awq_linear.py's output_head);
- bf16 dense layers (engine/runner/models/linear.py): oneDNN's packed weight, and where the
  native bf16 kernels exist (AVX512-BF16) and the weights are at most an eighth of the RAM
  (native.worth_a_second_copy), the row-major copy the GEMV reads as well; the output head a
  packed copy of its own (tied: beside the embedding).
"""

import functools
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.store.inspect import tensor_bytes
from kvdeck.engine.types.config import DTYPE_ALIASES

INT4_METHODS = ("awq", "gptq")
INT4_GROUP_SIZES = (32, 64, 128)  # kernels/cpu/int4.py GROUP_SIZES
INT4_TILE = 16  # output columns of an INT4 or int8 tile
INT4_GROUP_PARAM_BYTES = 4  # per group and column: fp16 scale, u8 zero, one byte unused
INT8_TILE_K = 64  # an int8 head's input size must be a multiple of this
INT8_BYTES_PER_WEIGHT = 1 + 1 / 16  # int8, and an fp16 scale per 32 weights
SECOND_COPY_MAX_SHARE_OF_MEMORY = 1 / 8  # kernels/cpu/native.py MAX_SHARE_OF_MEMORY
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """What this CPU (and kvdeck's build for it) can do, as the engine decides it."""

    bf16: bool  # torch's oneDNN runs bf16 (the engine's bf16 dtype on the CPU)
    bf16_kernels: bool  # kvdeck's native bf16 GEMV (AVX512-BF16): the row-major second copy
    int4_kernels: bool  # kvdeck's INT4 and int8 kernels (AVX-512 VNNI, or AVX2)
    ram_bytes: int | None = None  # the machine's memory (the bf16 second copy's limit); None: read it

    def dtype_note(self) -> str:
        """The dtypes the CPU engine runs here, in a few words."""
        if not self.bf16:
            return "in float32"
        if self.int4_kernels:
            return ("in bfloat16 for bf16 and INT4 checkpoints, float32 for others; INT4 layers at "
                    "4 bits, their output head int8")
        return "in bfloat16 for bf16 checkpoints, float32 for others"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`) from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def features_from_flags(flags: set[str], machine: str | None = None, native: bool | None = None,
                        isa: str | None = None) -> CpuFeatures:
    """The features those flags give (`native`: kvdeck's C kernels can be built and are not
    switched off; `isa`: KVDECK_CPU_ISA)."""
    machine = machine or platform.machine()
    x86 = machine in ("x86_64", "AMD64")
    if native is None:
        native = (x86 and os.environ.get("KVDECK_CPU_NATIVE", "1") != "0"
                  and shutil.which(os.environ.get("CC") or "cc") is not None)
    avx512 = (isa or os.environ.get("KVDECK_CPU_ISA", "native")) != "avx2"
    bf16 = {"avx512bw", "avx512vl", "avx512dq"} <= flags if x86 else "bf16" in flags
    vnni = avx512 and {"avx512_vnni", "avx512bw", "avx512f"} <= flags
    avx2 = {"avx2", "fma", "f16c"} <= flags
    return CpuFeatures(bf16=bf16, bf16_kernels=native and avx512 and "avx512_bf16" in flags,
                       int4_kernels=native and (vnni or avx2), ram_bytes=total_ram_bytes())


@functools.cache
def cpu_features() -> CpuFeatures:
    """This machine's (read once)."""
    return features_from_flags(cpu_flags())


def total_ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def checkpoint_dtype(config: dict) -> str:
    """The checkpoint's dtype as the engine reads it (engine/types/model_config.py)."""
    name = str(config.get("torch_dtype") or config.get("dtype") or "float32").replace("torch.", "")
    return DTYPE_ALIASES.get(name, "float32")


def quant_method(config: dict) -> str | None:
    quant = config.get("quantization_config")
    return str(quant.get("quant_method")) if isinstance(quant, dict) else None


def engine_cpu_dtype(config: dict, cpu: CpuFeatures) -> str:
    """The dtype the engine picks on this CPU for this checkpoint (dtype "auto")."""
    if not cpu.bf16:
        return "float32"
    if checkpoint_dtype(config) == "bfloat16":
        return "bfloat16"
    return "bfloat16" if quant_method(config) in INT4_METHODS and cpu.int4_kernels else "float32"


@dataclass(slots=True)
class WeightInventory:
    """A model's weights by how the CPU engine stores them."""

    # Per INT4 layer: out n, in k, group, its AutoAWQ/GPTQ integer bytes, its scales (model dtype).
    int4_layers: list[tuple[int, int, int, int, int]]
    dense_linear_elems: int = 0  # decoder-layer projections stored dense
    other_elems: int = 0  # embeddings, the untied head, norms, biases (model dtype)
    other_int_bytes: int = 0  # integer tensors outside INT4 layers
    vocab: int = 0  # the output head's rows
    hidden: int = 0  # ...and columns
    tied: bool = True  # the head is the input embedding
    head_bias: bool = False


def int4_tile_bytes(n: int, k: int, group: int) -> int:
    columns = -(-n // INT4_TILE) * INT4_TILE
    return columns * k // 2 + columns * (k // group) * INT4_GROUP_PARAM_BYTES


def int8_head_bytes(vocab: int, hidden: int) -> int:
    return int(-(-vocab // INT4_TILE) * INT4_TILE * hidden * INT8_BYTES_PER_WEIGHT)


def cpu_weight_bytes(inventory: WeightInventory, quantized: bool, dtype: str, cpu: CpuFeatures) -> int:
    """The bytes the loaded weights hold on the CPU in `dtype` (see the module's rules)."""
    element = DTYPE_BYTES[dtype]
    total = inventory.other_elems * element + inventory.other_int_bytes
    for n, k, group, stored, scales in inventory.int4_layers:
        repacked = cpu.int4_kernels and group in INT4_GROUP_SIZES and n % 8 == 0 and k % group == 0
        total += int4_tile_bytes(n, k, group) if repacked else stored + scales * element
    dense = inventory.dense_linear_elems * element
    total += dense
    head = inventory.vocab * inventory.hidden
    if quantized and cpu.int4_kernels and not inventory.head_bias and inventory.hidden % INT8_TILE_K == 0:
        return total + int8_head_bytes(inventory.vocab, inventory.hidden)
    if dtype != "bfloat16":
        return total  # float32: the native GEMV reads the weights as they are
    ram = cpu.ram_bytes if cpu.ram_bytes is not None else total_ram_bytes()
    second_copy = cpu.bf16_kernels and ram is not None and total <= ram * SECOND_COPY_MAX_SHARE_OF_MEMORY
    if second_copy:
        total += dense  # the row-major copy beside oneDNN's packed weights
    if inventory.tied or second_copy:
        total += head * element  # the head's packed copy (untied without a copy: it replaces)
    return total


def inventory_from_headers(headers: list[dict], config: dict) -> WeightInventory:
    """A model folder's weights, from its safetensors headers (kvdeck.app.store.inspect)."""
    tensors = {name: entry for header in headers for name, entry in header.items()
               if name != "__metadata__"}
    inventory = WeightInventory(int4_layers=[])
    int4_prefixes = {name.removesuffix(".qweight") for name in tensors if name.endswith(".qweight")}
    for prefix in int4_prefixes:
        scales = tensors.get(prefix + ".scales")
        if scales is None or len(scales["shape"]) != 2:
            continue
        groups, n = scales["shape"]
        qweight = tensors[prefix + ".qweight"]
        k = _numel(qweight["shape"]) * 8 // max(n, 1)
        stored = sum(tensor_bytes(tensors[prefix + suffix]) for suffix in (".qweight", ".qzeros", ".g_idx")
                     if prefix + suffix in tensors)
        inventory.int4_layers.append((n, k, k // max(groups, 1), stored, _numel(scales["shape"])))
    for name, entry in tensors.items():
        if name.rsplit(".", 1)[0] in int4_prefixes:
            continue
        if entry["dtype"] not in ("F32", "F16", "BF16", "F64"):
            inventory.other_int_bytes += tensor_bytes(entry)
        elif ".layers." in name and name.endswith(".weight") and len(entry["shape"]) == 2 \
                and "norm" not in name:
            inventory.dense_linear_elems += _numel(entry["shape"])
        else:
            inventory.other_elems += _numel(entry["shape"])
    head = tensors.get("lm_head.weight")
    embedding = next((entry for name, entry in tensors.items() if name.endswith("embed_tokens.weight")), None)
    shape = (head or embedding or {"shape": [0, 0]})["shape"]
    inventory.vocab, inventory.hidden = (int(shape[0]), int(shape[1])) if len(shape) == 2 else (0, 0)
    inventory.tied = head is None
    inventory.head_bias = "lm_head.bias" in tensors
    return inventory


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count
