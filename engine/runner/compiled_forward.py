"""Decode steps on CPU through torch.compile (inductor): one graph per batch-size bucket.

Eagerly, a batch-1 decode step on CPU is about a thousand small torch calls, and their
dispatch, not arithmetic, is most of the step once the weights are small (int8, bf16).
Inductor turns the forward into a few C++ loops around the matmuls (norms fused with the
residual add, rotary, the gated activation, the casts), with the paged attention and the KV
write kept as opaque custom ops (`kernels/cpu/compiled_ops.py`: one op per layer).

The shapes are those of the CUDA graphs (`decode_graphs.py`): static buffers padded to a
batch-size bucket, so each bucket is one static graph, compiled the first time a step of
that size runs (the first decode step of a bucket waits for it: about 10-60 s on two cores,
a few seconds when inductor's on-disk cache has it) and reused after; each compiled graph
is checked once against the eager forward on the same inputs. Prefill and mixed steps run
eagerly. `EngineConfig.compile_decode` switches it on; eager stays the default, exact
(bit for bit as transformers' fp32) and without any compile.
"""

import logging
import types
from collections.abc import Callable

import torch

from kvdeck.engine.runner.decode_graphs import DecodeGraphs, decode_bucket_sizes

logger = logging.getLogger(__name__)

# Every bucket is its own static graph; dynamo's default limit (8 graphs per function)
# would send the larger buckets back to eager without a word.
RECOMPILE_MARGIN = 4
# A compiled graph may differ from the eager forward by this much, relative to the largest
# hidden value (inductor fuses and reorders; fp32 stays within rounding).
FP32_TOLERANCE = 1e-3
BF16_TOLERANCE = 5e-2
# torch.compile's backend (tests count graphs with a backend of their own).
COMPILE_BACKEND: object = "inductor"


class CompiledDecode(DecodeGraphs):
    """DecodeGraphs whose "replays" call an inductor-compiled forward on the static buffers."""

    def __init__(self, model: torch.nn.Module, max_num_seqs: int, max_model_len: int, block_size: int,
                 hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.eager_model = model
        compiled = torch.compile(_own_forward(model), backend=COMPILE_BACKEND, dynamic=False)
        super().__init__(compiled, max_num_seqs, max_model_len, block_size, hidden_size, dtype, device)
        self.checked: set[int] = set()
        self.failed = False
        self.replays = {size: self._replay(size) for size in self.sizes}

    def _replay(self, size: int) -> Callable[[], None]:
        def replay() -> None:
            limit = len(decode_bucket_sizes(self.max_batch_size)) + RECOMPILE_MARGIN
            with torch._dynamo.config.patch(recompile_limit=limit):
                self._forward(size)
        return replay

    def can_run(self, meta, num_seqs: int) -> bool:
        return not self.failed and super().can_run(meta, num_seqs)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """As DecodeGraphs.run; a bucket's first run compiles it and checks it against the
        eager forward (a mismatch or a failed compile leaves the engine eager, and says why)."""
        num_seqs = input_ids.shape[0]
        size = self.sizes[[s >= num_seqs for s in self.sizes].index(True)]
        if size in self.checked:
            return super().run(input_ids, positions, meta)
        eager = self.eager_model(input_ids, positions, meta)
        try:
            compiled = super().run(input_ids, positions, meta)
        except Exception as exc:  # noqa: BLE001 - any compile failure means: run eagerly
            logger.warning("torch.compile of the decode forward failed, decode runs eagerly: %s", exc)
            self.failed = True
            return eager
        diff = (compiled.float() - eager.float()).abs().max().item()
        tolerance = FP32_TOLERANCE if self.dtype == torch.float32 else BF16_TOLERANCE
        if not diff <= tolerance * max(1.0, eager.abs().max().item()):
            logger.warning("compiled decode differs from the eager forward (max abs diff %.3g); "
                           "decode runs eagerly", diff)
            self.failed = True
            return eager
        self.checked.add(size)
        logger.info("compiled decode graph for batch size %d ready", size)
        return compiled


def _own_forward(model: torch.nn.Module) -> Callable:
    """`model.forward` on a code object of its own. Dynamo keeps compiled graphs, and counts
    them against its recompile limit, per code object: all engines of a class would share
    one count (and one stale cache) in a process that builds several (tests, benchmarks)."""
    function = type(model).forward
    code = function.__code__.replace()  # an equal, distinct code object
    own = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                             function.__closure__)
    return types.MethodType(own, model)
