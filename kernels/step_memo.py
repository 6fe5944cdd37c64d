"""Reuse per-step derived tensors across the layers of one forward pass."""

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class StepMemo(Generic[T]):
    """Remembers the value last built from a tuple of tensors, keyed by their identity.

    The model runner builds the step's metadata tensors once, and every layer passes the
    same objects, so what depends only on them (attention index plans, rotary cos/sin)
    is built by the first layer and reused by the rest. Weak references mean a freed
    tensor can never match a new one that happens to reuse its id.
    """

    __slots__ = ("_refs", "_params", "_value")

    def __init__(self) -> None:
        self._refs: tuple[weakref.ref, ...] = ()
        self._params: tuple = ()
        self._value: T | None = None

    def get(self, sources: tuple, params: tuple, build: Callable[[], T]) -> T:
        if (self._refs and self._params == params and len(self._refs) == len(sources)
                and all(ref() is t for ref, t in zip(self._refs, sources))):
            return self._value  # type: ignore[return-value]
        value = build()
        self._refs, self._params, self._value = tuple(weakref.ref(t) for t in sources), params, value
        return value
