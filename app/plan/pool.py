"""How many KV blocks a card holds for a model, before anything is downloaded:

    (memory * gpu_memory_utilization - weights - activation reserve) / block bytes

The reserve is what EngineCore's profiling run would find besides the weights: the CUDA
context and library workspaces (a fixed 0.75 GiB, what nvidia-smi shows for a CUDA process
with cuBLAS before any tensor) plus the activations of a full-size batch: each of
max_num_batched_tokens tokens holds the residual, the normed input, q/k/v and three MLP
intermediates in 16 bits at the widest point, and the sampled rows' fp32 logits."""

from dataclasses import dataclass

from kvdeck.app.plan.gpus import GPU
from kvdeck.app.plan.model_shapes import ModelShape

GIB = 2**30
CUDA_CONTEXT_BYTES = int(0.75 * GIB)


@dataclass(frozen=True, slots=True)
class PoolSize:
    num_blocks: int
    usable_bytes: float  # memory * utilisation
    weight_bytes: int
    reserve_bytes: int
    block_bytes: int

    def describe(self, gpu: GPU, utilisation: float) -> str:
        kv = self.usable_bytes - self.weight_bytes - self.reserve_bytes
        return (f"{gpu.name}: {gpu.memory_gib:g} GiB x {utilisation:g} - weights "
                f"{self.weight_bytes / GIB:.2f} GiB - reserve {self.reserve_bytes / GIB:.2f} GiB "
                f"= {kv / GIB:.2f} GiB of KV: {self.num_blocks} blocks of "
                f"{self.block_bytes / 2**20:.3g} MiB")


def activation_reserve(shape: ModelShape, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    per_token = 2 * (2 * shape.hidden_size + shape.head_dim * (shape.num_heads + 2 * shape.num_kv_heads)
                     + 3 * shape.intermediate_size)
    logits = min(max_num_seqs, max_num_batched_tokens) * shape.vocab_size * 4
    return CUDA_CONTEXT_BYTES + max_num_batched_tokens * per_token + logits


def pool_on_gpu(gpu: GPU, shape: ModelShape, quant: str, kv_dtype: str, block_size: int,
                gpu_memory_utilization: float, max_num_batched_tokens: int,
                max_num_seqs: int) -> PoolSize:
    """The pool; ValueError when the weights and the reserve leave no room for one block."""
    usable = gpu.memory_gib * GIB * gpu_memory_utilization
    weights = shape.weight_bytes(quant)
    reserve = activation_reserve(shape, max_num_batched_tokens, max_num_seqs)
    block_bytes = shape.kv_bytes_per_block(block_size, kv_dtype)
    num_blocks = int((usable - weights - reserve) // block_bytes)
    if num_blocks <= 0:
        raise ValueError(
            f"{shape.name} {quant} does not fit on {gpu.name}: weights {weights / GIB:.1f} GiB + "
            f"reserve {reserve / GIB:.1f} GiB > {usable / GIB:.1f} GiB usable "
            f"({gpu.memory_gib:g} GiB x gpu_memory_utilization {gpu_memory_utilization:g})")
    return PoolSize(num_blocks, usable, weights, reserve, block_bytes)
