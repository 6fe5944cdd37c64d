"""SuffixDecoding's two trees: one per running request over its prompt and output so far, and
one global tree over the outputs of the last `max_cached_requests` requests (the running
ones included, so a request also matches its own output there).

The global tree forgets requests first in, first out: starting a request past the limit
removes the oldest cached output's counts from it (0 turns the global tree off). Memory:
each tree over n tokens has at most 2n + 1 nodes, so the global tree is bounded by the
tokens of max_cached_requests outputs, and a request's own tree by its length.
"""

from collections.abc import Hashable

from kvdeck.engine.core.spec.suffix_tree import Draft, SuffixTree

_LOCAL_SEQ = 0  # a request's own tree holds one sequence


class SuffixCache:
    def __init__(self, max_tree_depth: int, max_cached_requests: int) -> None:
        if max_cached_requests < 0:
            raise ValueError(f"max_cached_requests must be >= 0, got {max_cached_requests}")
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.global_tree = SuffixTree(max_tree_depth)
        self.local_trees: dict[Hashable, SuffixTree] = {}
        self.cached: dict[Hashable, int] = {}  # request -> its output's sequence id, oldest first
        self._next_seq_id = 0

    def start(self, request_id: Hashable, prompt: list[int]) -> None:
        """A request begins: its own tree gets the prompt; the global tree a slot for its output
        (evicting the oldest cached output past the limit)."""
        if request_id in self.local_trees:
            raise ValueError(f"request {request_id!r} is already active")
        tree = self.local_trees[request_id] = SuffixTree(self.max_tree_depth)
        tree.extend(_LOCAL_SEQ, prompt)
        if self.max_cached_requests == 0:
            return
        if request_id in self.cached:
            self.evict(request_id)  # a reused id: its old output goes
        self.cached[request_id] = self._next_seq_id
        self._next_seq_id += 1
        while len(self.cached) > self.max_cached_requests:
            self.evict(next(iter(self.cached)))

    def add_output(self, request_id: Hashable, tokens: list[int]) -> None:
        self.local_trees[request_id].extend(_LOCAL_SEQ, tokens)
        seq_id = self.cached.get(request_id)
        if seq_id is not None:
            self.global_tree.extend(seq_id, tokens)

    def stop(self, request_id: Hashable) -> None:
        """The request finished: its own tree goes; its output stays cached until evicted."""
        del self.local_trees[request_id]

    def evict(self, request_id: Hashable) -> None:
        seq_id = self.cached.pop(request_id)
        if seq_id in self.global_tree:  # an output of no tokens never entered the tree
            self.global_tree.remove(seq_id)

    def clear(self) -> None:
        """Forget every cached output (running requests' outputs too: they stop being cached)."""
        self.global_tree = SuffixTree(self.max_tree_depth)
        self.cached.clear()

    def speculate(self, request_id: Hashable, context: list[int], max_spec_tokens: int,
                  max_spec_factor: float, min_token_prob: float) -> Draft:
        """The better (by expected accepted tokens) of the two trees' drafts."""
        args = (context, max_spec_tokens, max_spec_factor, min_token_prob)
        best = self.local_trees[request_id].speculate(*args)
        if self.cached:
            shared = self.global_tree.speculate(*args)
            if shared.score > best.score:
                best = shared
        return best
