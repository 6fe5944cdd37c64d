"""Persistent block-table rows (vLLM's input batch): one preallocated row per running request
and KV group, changed as the request's tables change, never rebuilt from lists each step.

A request keeps its row from its first step until the core forgets it; a forgotten row is
swapped out (the last row moves into the hole), so rows 0..num_rows-1 are the live ones.
Most steps change nothing but an appended block id. A table the block manager rewrote
(freed on preemption, shrunk after rejected drafts, entries released by a sliding window)
carries a new `table_epoch`, and its row is written again whole.

Entries past a table's length are 0, and a released entry (NO_BLOCK, -1) is stored as 0: a
valid block id the kernels never read there (the rows equal a rebuild from the lists,
padded with 0).
"""

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class TableOwner(Protocol):
    request_id: str
    block_tables: list[list[int]]  # one per KV group
    table_epoch: int  # bumped whenever a table changes other than by appending


class BlockTableRows:
    def __init__(self, num_groups: int, max_rows: int, max_blocks: int) -> None:
        self.num_groups = num_groups
        self.tables = np.zeros((num_groups, max(1, max_rows), max(1, max_blocks)), dtype=np.int32)
        self.counts: list[list[int]] = [[0] * self.tables.shape[1] for _ in range(num_groups)]
        self.epochs: list[int] = [0] * self.tables.shape[1]
        self.row_ids: list[str] = []  # row -> request id
        self.row_of: dict[str, int] = {}

    @property
    def num_rows(self) -> int:
        return len(self.row_ids)

    def rows_for(self, owners: Sequence[TableOwner],
                 changed: Sequence[TableOwner] | None = None) -> list[int]:
        """Each owner's row, its tables brought up to date (added if new). `changed`: every owner
        whose tables changed since the last call, so only those are looked at (the scheduler's
        batches carry it); None: each owner is looked at."""
        row_of = self.row_of
        for owner in owners if changed is None else changed:
            row = row_of.get(owner.request_id)
            if row is not None:
                self._sync(row, owner)
        get = row_of.get
        rows = [get(owner.request_id, -1) for owner in owners]
        if -1 in rows:  # new ones
            rows = [row if row >= 0 else self._add(owner) for row, owner in zip(rows, owners)]
        return rows

    def _sync(self, row: int, owner: TableOwner) -> None:
        if owner.table_epoch != self.epochs[row]:
            self._write(row, owner)
            return
        for group, table in enumerate(owner.block_tables):
            if len(table) != self.counts[group][row]:
                self._append(group, row, table)

    def forget(self, request_id: str) -> None:
        """Drop a request's row: the last row moves into its place."""
        row = self.row_of.pop(request_id, None)
        if row is None:
            return
        last = len(self.row_ids) - 1
        moved = self.row_ids.pop()
        if row != last:
            self.tables[:, row] = self.tables[:, last]
            for counts in self.counts:
                counts[row] = counts[last]
            self.epochs[row] = self.epochs[last]
            self.row_ids[row] = moved
            self.row_of[moved] = row
        self.tables[:, last] = 0
        for counts in self.counts:
            counts[last] = 0

    def live(self) -> np.ndarray:
        """[groups, num_rows, max_blocks]: the rows in use."""
        return self.tables[:, : self.num_rows]

    # ---- internals -------------------------------------------------------------------
    def _add(self, owner: TableOwner) -> int:
        row = len(self.row_ids)
        if row == self.tables.shape[1]:
            self._grow(rows=2 * row)
        self.row_ids.append(owner.request_id)
        self.row_of[owner.request_id] = row
        self._write(row, owner)
        return row

    def _write(self, row: int, owner: TableOwner) -> None:
        self.tables[:, row] = 0
        for group in range(self.num_groups):
            self.counts[group][row] = 0
            if group < len(owner.block_tables):
                self._append(group, row, owner.block_tables[group])
        self.epochs[row] = owner.table_epoch

    def _append(self, group: int, row: int, table: Sequence[int]) -> None:
        start = self.counts[group][row]
        end = len(table)
        if end > self.tables.shape[2]:
            self._grow(blocks=max(end, 2 * self.tables.shape[2]))
        if end == start + 1:  # one new block id, most calls: no array made for it
            self.tables[group, row, start] = max(table[start], 0)
        elif end > start:
            values = np.asarray(table[start:end], dtype=np.int32)
            self.tables[group, row, start:end] = np.maximum(values, 0)  # NO_BLOCK -> 0
        else:  # shorter without a new epoch: cannot happen through the block manager
            self.tables[group, row, end:start] = 0
        self.counts[group][row] = end

    def _grow(self, rows: int | None = None, blocks: int | None = None) -> None:
        groups, old_rows, old_blocks = self.tables.shape
        rows, blocks = rows or old_rows, blocks or old_blocks
        tables = np.zeros((groups, rows, blocks), dtype=np.int32)
        tables[:, :old_rows, :old_blocks] = self.tables
        self.tables = tables
        for counts in self.counts:
            counts.extend([0] * (rows - old_rows))
        self.epochs.extend([0] * (rows - old_rows))

