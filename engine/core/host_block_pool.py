"""Host swap space: which of its slots hold a swapped-out block (vLLM's CPU block allocator).

The runner keeps the slots' contents (`engine/runner/kv_swap.py`); the core hands out slot
numbers. A slot is taken by one swap-out and given back when its request resumes, finishes
or is aborted, so the free list plus the taken slots always make up the whole space.
"""

from collections import deque


class HostBlockPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 0:
            raise ValueError(f"a host swap space holds zero or more blocks, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._taken: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._taken)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """`num_blocks` free slots, or None (nothing taken) when fewer are free."""
        if num_blocks > len(self._free):
            return None
        slots = [self._free.popleft() for _ in range(num_blocks)]
        self._taken.update(slots)
        return slots

    def free(self, slots: list[int]) -> None:
        for slot in slots:
            if slot not in self._taken:
                raise RuntimeError(f"host slot {slot} freed but not taken")
            self._taken.remove(slot)
            self._free.append(slot)
