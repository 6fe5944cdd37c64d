"""One step's inputs, packed from the persistent block-table rows (block_table_rows.py).

The host does one short pass over the batch (each request's row, its first new position,
its new token ids, whether it samples) and the rest is array arithmetic: positions, slots,
query start offsets, context lengths and the step's block tables gathered from the rows.
On CUDA the arrays are laid out in one pinned host buffer and reach the device in one
transfer (two buffers in turns, so the host packs the next step while a copy is in flight);
on the CPU the tensors are the arrays themselves.

A verify chunk (speculative decoding) attends like k + 1 decode rows, one per token with
its own context length: the decode path, and decode graphs, serve it unchanged.
"""

from collections.abc import Sequence

import numpy as np
import torch

from kvdeck.engine.runner.batch import PLACEHOLDER, BatchPlan, ScheduledSequence
from kvdeck.engine.runner.block_table_rows import BlockTableRows
from kvdeck.engine.runner.models.layers import AttentionMetadata
from kvdeck.engine.runner.step_state import StepInputs
from kvdeck.engine.types.arith import cdiv

_ALIGN = 16  # bytes: every array's view of the staging buffer starts aligned


class InputBatch:
    def __init__(self, device: torch.device, block_size: int, num_groups: int, max_rows: int,
                 max_blocks: int, long_rope_from: int | None = None) -> None:
        self.device = device
        self.block_size = block_size
        self.num_groups = num_groups
        self.long_rope_from = long_rope_from
        self.rows = BlockTableRows(num_groups, max_rows, max_blocks)
        self.staging = _Staging(device) if device.type == "cuda" else None
        self.last_slots: list[np.ndarray] = []  # the last step's slots per group (blocks written)

    def forget(self, request_id: str) -> None:
        self.rows.forget(request_id)

    def prepare(self, batch: BatchPlan, previous: dict[str, int] | None = None) -> StepInputs:
        """The step's inputs. `previous` (async scheduling): the sample row of each request the
        step in flight samples; a decode row whose input is that step's placeholder takes its
        token from there, on the device (`placeholder_dst` <- `placeholder_src`)."""
        requests, num_new = batch.requests, batch.num_new_tokens
        rows = self.rows.rows_for(requests, getattr(batch, "changed_tables", None))
        inputs = StepInputs(num_requests=len(requests))
        # Plain decodes (first): one token each, the newest, sampled.
        plain = getattr(batch, "num_plain_decodes", 0)
        head = requests[:plain]
        ids = [request.output_token_ids[-1] for request in head]
        starts = [request.num_computed_tokens for request in head]
        inputs.sample_rows = list(range(plain))
        inputs.sample_requests = list(head)
        inputs.sample_batch_index = list(range(plain))
        spec_index: list[int] = []
        for index in range(plain, len(requests)):
            request, count = requests[index], num_new[index]
            start = request.num_computed_tokens
            starts.append(start)
            if request.spec_token_ids:
                ids.append(request.token_id_at(start))
                ids.extend(request.spec_token_ids)
                inputs.spec_rows.extend(range(len(ids) - count, len(ids)))
                inputs.spec_requests.append(request)
                inputs.spec_batch_index.append(index)
                spec_index.append(index)
                continue
            if count == 1:
                ids.append(request.token_id_at(start))
            else:
                ids.extend(request.all_token_ids[start : start + count])
            if request.params.prompt_logprobs is not None:
                targets = min(start + count, len(request.prompt_token_ids) - 1) - start
                if targets > 0:
                    inputs.prompt_logprob_spans.append((index, len(ids) - count, start, targets))
            if request.params.embed and start + count == len(request.prompt_token_ids):
                inputs.embedding_rows.append((index, len(ids) - 1))
            if start + count == request.num_tokens:
                inputs.sample_rows.append(len(ids) - 1)
                inputs.sample_requests.append(request)
                inputs.sample_batch_index.append(index)
        arrays, longest = self._layout(requests, rows, starts, num_new, spec_index)
        arrays["input_ids"] = input_ids = np.asarray(ids, dtype=np.int64)
        if previous is not None:
            waiting = np.flatnonzero(input_ids == PLACEHOLDER)
            if waiting.size:
                owner = waiting if len(ids) == len(requests) else \
                    np.repeat(np.arange(len(requests)), np.asarray(num_new))[waiting]
                arrays["placeholder_dst"] = waiting.astype(np.int64)
                arrays["placeholder_src"] = np.asarray(
                    [previous[requests[i].request_id] for i in owner.tolist()], dtype=np.int64)
        self._to_tensors(inputs, arrays, longest)
        return inputs

    def _layout(self, requests: Sequence[ScheduledSequence], rows: list[int], starts: list[int],
                num_new: Sequence[int], spec_index: list[int],
                ) -> tuple[dict[str, np.ndarray], tuple[int, int]]:
        """Positions, slots and the attention sequences' metadata, as arrays; the longest
        query and context."""
        n = len(requests)
        starts_np = np.asarray(starts, dtype=np.int64)
        rows_np = np.asarray(rows, dtype=np.int64)
        total = sum(num_new)
        if total == n:  # one token a row: each row is one attention sequence of one query
            token_req = None
            positions = starts_np
            token_rows = seq_rows = rows_np
            seq_lens = starts_np + 1
            query_start_loc = np.arange(n + 1, dtype=np.int32)
            longest_query = 1
        else:
            counts = np.asarray(num_new, dtype=np.int64)
            token_req = np.repeat(np.arange(n), counts)
            first = np.cumsum(counts) - counts
            positions = starts_np[token_req] + (np.arange(total) - first[token_req])
            token_rows = rows_np[token_req]
            # Attention sequences start at each request's first token, and at every token of
            # a verify chunk.
            begins = np.zeros(total, dtype=bool)
            begins[first] = True
            if spec_index:
                speculating = np.zeros(n, dtype=bool)
                speculating[spec_index] = True
                begins |= speculating[token_req]
            seq_first = np.flatnonzero(begins)
            seq_last = np.append(seq_first[1:], total) - 1
            query_lens = seq_last - seq_first + 1
            seq_rows = token_rows[seq_first]
            seq_lens = positions[seq_last] + 1
            query_start_loc = np.concatenate(([0], np.cumsum(query_lens))).astype(np.int32)
            longest_query = int(query_lens.max())
        bs = self.block_size
        longest_seq = int(seq_lens.max())
        width = cdiv(longest_seq, bs)
        tables = self.rows.tables
        arrays = {
            "positions": positions,
            "query_start_loc": query_start_loc,
            "seq_lens": seq_lens.astype(np.int32),
        }
        block_index, offset = np.divmod(positions, bs)
        self.last_slots = []
        for group in range(self.num_groups):
            slots = tables[group, token_rows, block_index].astype(np.int64) * bs + offset
            self.last_slots.append(slots)
            arrays[f"slots{group}"] = slots
            arrays[f"tables{group}"] = tables[group, seq_rows, :width]
        if self.long_rope_from is not None:  # a long request's rows follow the short table's (rotary.py)
            shift = np.asarray([self.long_rope_from if r.long_rope else 0 for r in requests], dtype=np.int64)
            arrays["positions"] = positions + (shift if token_req is None else shift[token_req])
        return arrays, (longest_query, longest_seq)

    def _to_tensors(self, inputs: StepInputs, arrays: dict[str, np.ndarray],
                    longest: tuple[int, int]) -> None:
        if self.staging is not None:
            tensors = self.staging.to_device(arrays)
        else:
            tensors = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in arrays.items()}
        groups = [(tensors[f"slots{g}"], tensors[f"tables{g}"]) for g in range(self.num_groups)]
        inputs.input_ids = tensors["input_ids"]
        inputs.placeholder_dst = tensors.get("placeholder_dst")
        inputs.placeholder_src = tensors.get("placeholder_src")
        inputs.positions = tensors["positions"]
        inputs.meta = AttentionMetadata(
            slot_mapping=groups[0][0],
            block_tables=groups[0][1],
            query_start_loc=tensors["query_start_loc"],
            seq_lens=tensors["seq_lens"],
            max_query_len=longest[0],
            max_seq_len=longest[1],
            other_groups=tuple(groups[1:]),
        )

    def blocks_written(self) -> list[int]:
        """The blocks the last step wrote K/V into, every group's."""
        if not self.last_slots:
            return []
        slots = np.concatenate(self.last_slots)
        return np.unique(slots[slots >= 0] // self.block_size).tolist()


class _Staging:
    """Pinned host buffers (two, in turns) and one device buffer: a step's arrays go over in
    one copy, and the host never writes a buffer whose copy may still be running."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.host: list[torch.Tensor | None] = [None, None]
        self.copied: list[torch.cuda.Event | None] = [None, None]
        self.on_device: torch.Tensor | None = None
        self.turn = 0

    def to_device(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        offsets, total = {}, 0
        for name, array in arrays.items():
            offsets[name] = total
            total += -(-array.nbytes // _ALIGN) * _ALIGN
        turn, self.turn = self.turn, self.turn ^ 1
        host = self.host[turn]
        if host is None or host.numel() < total:
            host = self.host[turn] = torch.empty(2 * total, dtype=torch.uint8, pin_memory=True)
        elif self.copied[turn] is not None:
            self.copied[turn].synchronize()
        if self.on_device is None or self.on_device.numel() < total:
            self.on_device = torch.empty(2 * total, dtype=torch.uint8, device=self.device)
        staged = host.numpy()
        for name, array in arrays.items():
            start = offsets[name]
            staged[start : start + array.nbytes] = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        self.on_device[:total].copy_(host[:total], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.copied[turn] = event
        out = {}
        for name, array in arrays.items():
            start = offsets[name]
            flat = self.on_device[start : start + array.nbytes].view(_TORCH_DTYPES[array.dtype])
            out[name] = flat.view(array.shape)
        return out


_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}
