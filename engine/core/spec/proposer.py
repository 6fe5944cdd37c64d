"""What the speculative decoder needs of a proposer (n-gram lookup, a draft model)."""

from collections.abc import Sequence
from typing import Any, Protocol

from kvdeck.engine.core.request import Request


class Proposer(Protocol):
    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> list[list[int]]:
        """Up to num_drafts[i] draft tokens to follow requests[i]'s newest token."""

    def draft_probs(self) -> dict[str, Any] | None:
        """The distributions the last proposals were drawn from, by request id ([k, vocab]
        tensors); None where drafts are point masses (n-gram lookup)."""

    def on_verified(self, request: Request) -> None:
        """The target verified the request's drafts (its computed tokens are final now)."""

    def on_preempted(self, request: Request) -> None:
        """The request lost its K/V; whatever the proposer kept for it is stale."""

    def forget(self, request_id: str) -> None:
        """The request finished."""

    def pool_stats(self) -> tuple[int, list[int]] | None:
        """A draft model's own KV pool: (blocks, ref count per block); None without one."""

    def sequence_stats(self, request_id: str) -> tuple[list[int], int] | None:
        """A draft model's (block table, computed tokens) for the request; None without one."""
