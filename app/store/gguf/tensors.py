"""A GGUF's tensors as transformers' tensors: names, shapes and dequantised values.

Names come from the `gguf` package's tensor name map (what transformers' GGUF loader uses,
applied to the parameters of a model built on the meta device, so no memory is spent on
it), values from its `dequantize`, and the per-architecture fix-ups from transformers'
tensor processors (for Llama, llama.cpp's q/k row permutation is undone there). Large
tensors are dequantised a slice of rows at a time, so memory stays near one slice.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from kvdeck.app.store.gguf.header import GGUFImportError
from kvdeck.app.store.safetensors_stream import TensorSpec

CHUNK_BYTES = 64 * 1024**2  # float32 bytes dequantised at a time
# Tensors llama.cpp adds that are not weights: Llama 3's rope factors (read into config.json).
CONSUMED_TENSORS = ("rope_freqs.weight",)


@dataclass(slots=True)
class TensorJob:
    tensor: object  # gguf.ReaderTensor
    hf_name: str
    shape: tuple[int, ...]  # torch order

    @property
    def gguf_name(self) -> str:
        return self.tensor.name

    @property
    def nbytes(self) -> int:
        return int(self.tensor.n_bytes)


@cache
def can_dequantize(qtype) -> bool:
    """Whether the installed `gguf` package can turn this ggml type into floats (probed once)."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def check_tensor_types(reader, path: Path) -> None:
    bad = sorted({t.tensor_type.name for t in reader.tensors if not can_dequantize(t.tensor_type)})
    if bad:
        raise GGUFImportError(
            f"{path.name}: tensor type(s) {', '.join(bad)} cannot be dequantised by the installed"
            " `gguf` package; this file cannot be imported"
        )


def check_complete(reader, path: Path) -> None:
    """Every tensor's bytes lie inside the file (a cut-off download fails here, by name)."""
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise GGUFImportError(
                f"{path.name}: truncated: tensor {t.name!r} ends at byte {end}, the file has {size}"
            )


def tensor_processor(architecture: str, config):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())


def plan_tensors(reader, config, architecture: str, path: Path) -> list[TensorJob]:
    """Every tensor the model needs, from the file, in file order; errors name what is off."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    name_map = gguf_to_hf_names(architecture, config.num_hidden_layers, expected)
    jobs = []
    for t in reader.tensors:
        if t.name in CONSUMED_TENSORS:
            continue
        hf_name = name_map.get(t.name)
        if hf_name is None or hf_name not in expected:
            raise GGUFImportError(
                f"{path.name}: tensor {t.name!r} has no place in {type(model).__name__}"
            )
        jobs.append(TensorJob(t, hf_name, tuple(int(d) for d in reversed(t.shape))))
    missing = sorted(expected - {job.hf_name for job in jobs})
    if missing:
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        raise GGUFImportError(f"{path.name}: lacks {len(missing)} weight(s) the model needs: {shown}")
    return jobs


def gguf_to_hf_names(architecture: str, num_layers: int, hf_names: set[str]) -> dict[str, str]:
    """GGUF tensor name -> transformers parameter name (transformers' `get_gguf_hf_weights_map`
    does the same, but walks every submodule's state dict, which takes seconds)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(key for key, value in MODEL_ARCH_NAMES.items() if value == architecture)
    names = get_tensor_name_map(arch, num_layers)
    mapping = {}
    for hf_name in hf_names:
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = names.get_name(base)
        if gguf_base is not None:
            mapping[f"{gguf_base}.{suffix}"] = hf_name
    return mapping


def specs(jobs: list[TensorJob]) -> list[TensorSpec]:
    return [TensorSpec(job.hf_name, job.shape) for job in jobs]


def dequantised_rows(job: TensorJob, processor, dtype: torch.dtype) -> Iterator[torch.Tensor]:
    """The tensor's values in `dtype`, as consecutive slices of rows (one slice if it must be whole)."""
    from gguf.quants import dequantize

    data, qtype = job.tensor.data, job.tensor.tensor_type
    row_bytes = 4 * (job.shape[-1] if len(job.shape) > 1 else 1)
    rows_per_chunk = max(1, CHUNK_BYTES // row_bytes)
    if len(job.shape) < 2 or _must_be_whole(processor, job.gguf_name) or job.shape[0] <= rows_per_chunk:
        values = processor.process(weights=dequantize(data, qtype), name=job.gguf_name).weights
        yield _to_torch(values, job, dtype)
        return
    for start in range(0, job.shape[0], rows_per_chunk):
        yield _to_torch(dequantize(data[start : start + rows_per_chunk], qtype), job, dtype)


def _must_be_whole(processor, gguf_name: str) -> bool:
    """A processor that rearranges rows needs the whole tensor; Llama's only touches q and k."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, TensorProcessor

    if type(processor) is TensorProcessor:
        return False
    if type(processor) is LlamaTensorProcessor:
        return ".attn_q." in gguf_name or ".attn_k." in gguf_name
    return True


def _to_torch(values: np.ndarray, job: TensorJob, dtype: torch.dtype) -> torch.Tensor:
    # A copy: the reader's arrays are read-only views of the memory-mapped file.
    tensor = torch.from_numpy(np.array(values, dtype=np.float32, copy=True))
    if tuple(tensor.shape[1:]) != job.shape[1:] or tensor.dim() != len(job.shape):
        raise GGUFImportError(
            f"tensor {job.gguf_name!r} dequantised to shape {tuple(tensor.shape)}, expected {job.shape}"
        )
    return tensor.to(dtype)
