"""Multi-LoRA in the runner: adapters checked and kept on the host (an LRU of max_cpu_loras),
loaded into max_loras device slots as steps need them, and each step's per-token slot.

- `add(request)` (the core calls it when a request names an adapter, and for add_lora)
  reads and checks the folder; every check runs before a weight is read.
- `plan(batch)` (packing a step) says which adapter each token uses; None for a step of base
  rows only, which then runs as it would without LoRA (decode graphs, the CPU decoder stack).
- `forward(model, inputs)` (running a step with adapter rows) puts the step's adapters in
  slots (evicting the least recently used slot no row of this step needs), sets the per-row
  slots every `LinearSlots` reads, and runs the model's Python forward eagerly.
- `graph_token_slots(plan)` (a decode-only step the adapter decode graphs replay) puts the
  step's adapters in slots and gives each row's slot for the graphs' static buffer
  (`graph_inputs`, graph_inputs.py).
On the Triton path the device's launch config (kernels/triton/lora_plan.py) chooses the
per-row kernels (a step's adapter rows and their slots) or the grouped ones (`tile_rows`:
the step's rows in tiles of one slot, kernels/reference/lora_tiles.py).
The scheduler keeps the distinct adapters of a step at most max_loras, so slots never run out.
"""

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kvdeck.engine.runner.lora.adapter import HostAdapter, LoRATarget, load_adapter, model_targets
from kvdeck.engine.runner.lora.graph_inputs import LoRAGraphInputs, python_forward
from kvdeck.engine.runner.lora.slots import LinearSlots, LoRAContext, LoRAStep
from kvdeck.engine.runner.lora.warm_up import warm_up_ranks
from kvdeck.engine.runner.models.linear import Linear
from kvdeck.engine.types.lora import LoRARequest, read_adapter_info
from kvdeck.engine.types.stats import LoRASlotStats
from kvdeck.kernels.dispatch import lora_shrink_splits, lora_tile_rows
from kvdeck.kernels.reference.lora_grouped import group_rows
from kvdeck.kernels.reference.lora_tiles import TILE_FIELDS, RowTiles, device_row_tiles, max_row_tiles


@dataclass(slots=True)
class LoRAStepPlan:
    """A step's adapters: each token's adapter id (0: the base) and the adapters by id."""

    token_ids: np.ndarray  # int64 [num_tokens]
    adapters: dict[int, LoRARequest]


class LoRAManager:
    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, max_cpu_loras: int,
                 dtype: torch.dtype, device: torch.device, backend: str = "auto") -> None:
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or not len(layers):
            raise ValueError(f"enable_lora: {type(model).__name__} has no decoder layers kvdeck can "
                             "apply adapters to")
        self.targets: dict[str, LoRATarget] = model_targets(layers[0], getattr(model, "packed_modules", {}))
        if not self.targets:
            raise ValueError(f"enable_lora: {type(model).__name__} has none of the projections LoRA "
                             "adapters target")
        self.num_layers = len(layers)
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self.dtype = dtype
        self.device = device
        self.backend = backend
        self._torch_path = backend == "torch" or (backend == "auto" and device.type != "cuda")
        self.tile_rows = 0 if self._torch_path else lora_tile_rows(device, backend)  # 0: per-row kernels
        self.context = LoRAContext()
        # Per layer: linear path -> its slots (attached to the Linear as `lora`).
        self.layer_slots: list[dict[str, LinearSlots]] = []
        for layer in layers:
            slots = {}
            for path in {target.linear for target in self.targets.values()}:
                linear: Linear = layer.get_submodule(path)
                slots[path] = LinearSlots(self.context, max_loras, max_rank, linear.input_size,
                                          linear.output_sizes, dtype, device)
                linear.attach_lora(slots[path])
            self.layer_slots.append(slots)
        self.host: OrderedDict[int, HostAdapter] = OrderedDict()  # LRU, newest last
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, LRU, newest last
        self.rank_of: dict[int, int] = {}  # adapter id -> its rank (slotted adapters)
        self.slot_request: dict[int, LoRARequest] = {}  # adapter id -> the adapter in its slot
        self.free_slots = list(range(max_loras))
        # Each slot's rank on the device: the decode graphs' kernels read it (graph_inputs.py).
        self.slot_ranks = torch.zeros(max_loras, dtype=torch.int32, device=device)
        self._warmed = False  # the Triton kernels' variants compiled (warm_up)
        # The torch path's last step: (token ids, slot table, rank, its LoRAStep).
        self._last_step: tuple[np.ndarray, dict[int, int], int, LoRAStep | None] | None = None
        self._lock = threading.Lock()  # the core thread adds; an async step's thread loads slots

    # ---- the host copies ---------------------------------------------------------------
    def add(self, request: LoRARequest) -> bool:
        """Check and keep `request`'s adapter on the host; False if it is held already.
        ValueError naming the problem (nothing kept) for a bad adapter or an id in use by
        another adapter."""
        with self._lock:
            held = self.host.get(request.lora_int_id)
            # The id may name an adapter still in a slot whose host copy the LRU dropped.
            known = held.request if held is not None else self.slot_request.get(request.lora_int_id)
            if known is not None:
                _check_same(known, request)
            if held is not None:
                self.host.move_to_end(request.lora_int_id)
                return False
        adapter = self._read(request)  # outside the lock: it reads the file
        with self._lock:
            self.host[request.lora_int_id] = adapter
            self.host.move_to_end(request.lora_int_id)
            while len(self.host) > self.max_cpu_loras:
                self.host.popitem(last=False)
        return True

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter's host copy and slot; whether it was held. A request still using
        it has its own LoRARequest: its next step reloads it from the folder."""
        with self._lock:
            held = self.host.pop(lora_int_id, None) is not None
            slot = self.slot_of.pop(lora_int_id, None)
            if slot is not None:
                self.rank_of.pop(lora_int_id, None)
                self.slot_request.pop(lora_int_id, None)
                self.free_slots.append(slot)
            return held or slot is not None

    def list(self) -> list[int]:
        with self._lock:
            return sorted(self.host)

    def slot_stats(self) -> LoRASlotStats:
        """Which adapter sits in which slot, and the host copies held (the stats snapshot's)."""
        with self._lock:
            names: list[str | None] = [None] * self.max_loras
            ranks = [0] * self.max_loras
            for lora_int_id, slot in self.slot_of.items():
                names[slot] = self.slot_request[lora_int_id].lora_name
                ranks[slot] = self.rank_of[lora_int_id]
            return LoRASlotStats(names, ranks, len(self.host), self.max_cpu_loras)

    def _read(self, request: LoRARequest) -> HostAdapter:
        info = read_adapter_info(request.lora_path)
        return load_adapter(request, info, self.targets, self.num_layers, self.max_rank, self.dtype)

    # ---- a step ------------------------------------------------------------------------
    def plan(self, requests: Sequence, num_new_tokens: Sequence[int]) -> LoRAStepPlan | None:
        """Each token's adapter for a step whose tokens are laid out request by request, or
        None when no request of the step has one."""
        adapters: dict[int, LoRARequest] = {}
        ids = []
        for request in requests:
            lora = getattr(request, "lora_request", None)  # a draft's sequences have none
            if lora is None:
                ids.append(0)
            else:
                ids.append(lora.lora_int_id)
                adapters[lora.lora_int_id] = lora
        if not adapters:
            return None
        return LoRAStepPlan(np.repeat(np.asarray(ids, dtype=np.int64), np.asarray(num_new_tokens)), adapters)

    def forward(self, model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, meta,
                plan: LoRAStepPlan) -> torch.Tensor:
        """Run the model for a step with adapter rows: the Python forward, eager."""
        slot_table = self._slots_for(plan.adapters)
        rank = max(self.rank_of[i] for i in plan.adapters)
        last = self._last_step
        if (self._torch_path and last is not None and last[1] == slot_table and last[2] == rank
                and np.array_equal(last[0], plan.token_ids)):
            step = last[3]  # decode's rows and adapters stay from step to step: the same groups
        elif self._torch_path:  # rows grouped by adapter: each row pays for its own adapter only
            token_slots = _token_slots(plan.token_ids, slot_table)
            groups = group_rows(token_slots, self.dtype, self.device)
            # No token of an adapter's request in this step (None): the layers add nothing.
            step = None if groups is None else LoRAStep(None, None, rank, len(slot_table), self.backend,
                                                        groups)
            self._last_step = (plan.token_ids, slot_table, rank, step)
        elif self.tile_rows:  # Triton, grouped: tiles of one slot's rows (none: the base alone)
            tiles = device_row_tiles(_token_slots(plan.token_ids, slot_table), self.tile_rows, self.device)
            step = None if tiles.tiles.shape[0] == 0 else LoRAStep(
                None, None, rank, max(slot_table.values()) + 1, self.backend, slot_ranks=self.slot_ranks,
                tiles=tiles)
        else:  # Triton: only the adapter rows are launched
            token_slots = _token_slots(plan.token_ids, slot_table)
            rows = np.flatnonzero(token_slots >= 0)
            rows_t = None if rows.size == token_slots.size else torch.from_numpy(rows).to(self.device)
            step = LoRAStep(rows_t, torch.from_numpy(token_slots[rows]).to(self.device), rank,
                            max(slot_table.values()) + 1, self.backend)
        self.context.step = step
        try:
            return self._eager_forward(model, input_ids, positions, meta)
        finally:
            self.context.step = None

    def graph_inputs(self, max_batch: int) -> LoRAGraphInputs:
        """The static inputs of adapter decode graphs of up to `max_batch` rows."""
        token_slots = torch.full((max_batch,), -1, dtype=torch.long, device=self.device)
        inputs = LoRAGraphInputs(self.context, token_slots, self.slot_ranks, self.max_rank, self.max_loras,
                                 self.backend)
        if self.tile_rows:  # the grouped kernels: tiles for any mix of max_batch rows
            inputs.tile_rows = self.tile_rows
            inputs.num_tiles = max_row_tiles(max_batch, self.max_loras, self.tile_rows)
            inputs.packed_tiles = torch.zeros(inputs.num_tiles * TILE_FIELDS + max_batch, dtype=torch.int32,
                                              device=self.device)
            inputs.tiles = RowTiles.from_packed(inputs.packed_tiles, inputs.num_tiles)
        return inputs

    def graph_token_slots(self, plan: LoRAStepPlan) -> np.ndarray:
        """For a step the adapter decode graphs replay: its adapters put in slots (as
        `forward` does), and each row's slot (-1: the base), int64 on the host
        (LoRAGraphInputs.set_rows copies it)."""
        slot_table = self._slots_for(plan.adapters)
        return _token_slots(plan.token_ids, slot_table)

    def warm_up(self) -> int:
        """Compile the Triton kernels' variants before serving (warm_up.py): each distinct
        layer's slots applied to one dummy row under each rank class, with every row and with
        a list of rows, on slot 0 (whatever it holds: the output is thrown away). Once is
        enough; nothing on the torch path. The launches' count."""
        if self._torch_path or self._warmed:
            return 0
        self._warmed = True
        layers = {(s.a.shape[-1], tuple(s.output_sizes)): s for s in self.layer_slots[0].values()}
        row = torch.zeros(1, dtype=torch.long, device=self.device)
        runs = 0
        multipliers = [len(sizes) * splits for in_size, sizes in layers
                       for splits in (1, lora_shrink_splits(in_size, self.device))]
        tiles = None
        if self.tile_rows:  # the grouped kernels: one tile of row 0 at slot 0 (no per-row forms)
            tiles = device_row_tiles(np.zeros(1, dtype=np.int64), self.tile_rows, self.device)
        for rank in warm_up_ranks(self.max_rank, multipliers):
            for rows in (None, row) if tiles is None else (None,):
                ranks = None if tiles is None else self.slot_ranks
                self.context.step = LoRAStep(rows, row, rank, 1, self.backend, slot_ranks=ranks, tiles=tiles)
                try:
                    for (in_size, sizes), slots in layers.items():
                        x = torch.zeros(1, in_size, dtype=self.dtype, device=self.device)
                        out = torch.zeros(1, sum(sizes), dtype=self.dtype, device=self.device)
                        slots.apply(x, lambda _, out=out: out)
                        runs += 1
                finally:
                    self.context.step = None
        return runs

    @staticmethod
    def _eager_forward(model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                       meta) -> torch.Tensor:
        return python_forward(model, input_ids, positions, meta)  # the decoder stack cannot apply them

    def _slots_for(self, adapters: dict[int, LoRARequest]) -> dict[int, int]:
        """Adapter id -> slot for the step's adapters, loading those not in a slot."""
        with self._lock:
            table = {}
            for lora_int_id, request in adapters.items():
                slot = self.slot_of.get(lora_int_id)
                if slot is None or self.slot_request.get(lora_int_id) != request:
                    slot = self._take_slot(adapters) if slot is None else slot
                    adapter = self._host_copy(request)
                    self._load_slot(slot, adapter)
                    self.slot_of[lora_int_id] = slot
                    self.rank_of[lora_int_id] = adapter.rank
                    self.slot_ranks[slot] = adapter.rank
                    self.slot_request[lora_int_id] = adapter.request
                self.slot_of.move_to_end(lora_int_id)
                table[lora_int_id] = slot
            return table

    def _take_slot(self, needed: dict[int, LoRARequest]) -> int:
        if self.free_slots:  # the lowest first: a step computes slots [0, highest used]
            self.free_slots.sort()
            return self.free_slots.pop(0)
        for lora_int_id, slot in self.slot_of.items():  # least recently used first
            if lora_int_id not in needed:
                del self.slot_of[lora_int_id]
                self.rank_of.pop(lora_int_id, None)
                self.slot_request.pop(lora_int_id, None)
                return slot
        raise RuntimeError(f"a step needs {len(needed)} LoRA adapters, more than max_loras "
                           f"({self.max_loras}) slots")

    def _host_copy(self, request: LoRARequest) -> HostAdapter:
        """The adapter's host copy, read again if the LRU dropped it."""
        adapter = self.host.get(request.lora_int_id)
        if adapter is not None and adapter.request != request:  # the id was given to another since
            del self.host[request.lora_int_id]
            adapter = None
        if adapter is None:
            adapter = self.host[request.lora_int_id] = self._read(request)
            while len(self.host) > self.max_cpu_loras:
                self.host.popitem(last=False)
        self.host.move_to_end(request.lora_int_id)
        return adapter

    def _load_slot(self, slot: int, adapter: HostAdapter) -> None:
        for layer_slots in self.layer_slots:
            for linear_slots in layer_slots.values():
                linear_slots.clear(slot)
        for (layer, module), (a, b) in adapter.weights.items():
            target = self.targets[module]
            self.layer_slots[layer][target.linear].load(slot, target.slice, a.to(self.device),
                                                         b.to(self.device))


def lora_slot_stats(manager: LoRAManager | None) -> LoRASlotStats | None:
    """The stats snapshot's `lora` field: None with LoRA off."""
    return manager.slot_stats() if manager is not None else None


def _check_same(held: LoRARequest, asked: LoRARequest) -> None:
    if (held.lora_name, held.lora_path) != (asked.lora_name, asked.lora_path):
        raise ValueError(f"lora_int_id {asked.lora_int_id} is already adapter {held.lora_name!r} "
                         f"({held.lora_path}); remove it first or use another id")


def _token_slots(token_ids: np.ndarray, slot_table: dict[int, int]) -> np.ndarray:
    """Each token's slot (its request's adapter id -> slot), -1 for a base token."""
    return np.asarray([slot_table.get(i, -1) for i in token_ids.tolist()], dtype=np.int64)
