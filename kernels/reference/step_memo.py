"""Reuse per-step derived tensors across the layers of one forward pass."""

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class StepMemo(Generic[T]):
    """Remembers the values last built from tuples of tensors, keyed by their identity.

    The model runner builds the step's metadata tensors once, and every layer passes the
    same objects, so what depends only on them (attention index plans, rotary cos/sin)
    is built by the first layer and reused by the rest. Weak references mean a freed
    tensor can never match a new one that happens to reuse its id. `capacity` > 1 keeps
    several (a hybrid model's layers alternate between KV groups and windows).
    """

    __slots__ = ("_entries", "_capacity")

    def __init__(self, capacity: int = 1) -> None:
        self._entries: list[tuple[tuple[weakref.ref, ...], tuple, T]] = []
        self._capacity = capacity

    def get(self, sources: tuple, params: tuple, build: Callable[[], T]) -> T:
        for refs, entry_params, value in self._entries:
            if (entry_params == params and len(refs) == len(sources)
                    and all(ref() is t for ref, t in zip(refs, sources))):
                return value
        value = build()
        entry = (tuple(weakref.ref(t) for t in sources), params, value)
        self._entries = [entry, *self._entries[: self._capacity - 1]]
        return value
