"""A depth-bounded suffix tree over token sequences, with frequency counts (SuffixDecoding's,
as Arctic Inference builds it, in Python).

It holds every suffix of every sequence, each cut to its first `max_depth` tokens, as paths
from the root. A node's `count` is how many of those suffixes pass through or end in it, so
for a pattern P of at most max_depth tokens, count(P) is the number of occurrences of P in
the sequences, and count(P + t) / count(P) estimates how likely t follows P.

Edges are compressed (a node's edge holds `length` tokens, read from one of the sequences
through `ref_seq`/`ref_idx`), and a node only exists where paths branch or a suffix ends, so
a tree over n tokens has at most 2n + 1 nodes, whatever max_depth is. Appending a token
updates the tree in O(max_depth) steps (one per suffix still growing: the `active` nodes);
removing a sequence undoes its counts in O(its length x max_depth).
"""

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Node:
    token: int = -1  # the first token of the edge into this node
    parent: "Node | None" = None
    count: int = 0  # suffixes that pass through or end in this node
    length: int = 0  # tokens on the edge into this node
    ref_seq: int = -1  # the edge's tokens are seqs[ref_seq][ref_idx : ref_idx + length]
    ref_idx: int = -1
    children: dict[int, "Node"] = field(default_factory=dict)
    endpoints: dict[int, int] = field(default_factory=dict)  # seq id -> end of a suffix ending here


@dataclass(slots=True)
class Draft:
    token_ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # each token's estimated probability
    score: float = 0.0  # the sum of probs: the expected number of accepted tokens
    match_len: int = 0  # how many context tokens the draft's continuation was matched on


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"a suffix tree's max_depth must be at least 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = Node()
        self.seqs: dict[int, list[int]] = {}
        self._active: dict[int, deque[Node]] = {}  # per sequence: where its growing suffixes end

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(len(seq) for seq in self.seqs.values())

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        for token in tokens:
            self.append(seq_id, token)

    def append(self, seq_id: int, token: int) -> None:
        """Add `token` to the end of sequence `seq_id` (a new sequence if unknown)."""
        seq = self.seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, deque())
        root = self.root
        # A new suffix starts at the root; the oldest stops growing at max_depth tokens.
        active.append(root)
        root.endpoints[seq_id] = len(seq)
        root.count += 1
        if len(active) > self.max_depth:
            active.popleft()
        seq.append(token)
        end = len(seq)
        for i, node in enumerate(active):
            child = node.children.get(token)
            if child is None:
                if node.count == 1 and node is not root:
                    # Only this suffix reaches the node (a leaf): its edge grows by the token.
                    node.length += 1
                    node.endpoints[seq_id] += 1
                else:
                    new = Node(token, node, 1, 1, seq_id, end - 1)
                    new.endpoints[seq_id] = end
                    node.children[token] = new
                    del node.endpoints[seq_id]
                    active[i] = new
            elif node.count == child.count + 1 and node is not root:
                # Every other suffix through the node goes on into `child`: this one joins them.
                if child.length == 1:
                    # The suffix now ends where the child does: the child takes the node's place.
                    child.token = node.token
                    child.count += 1
                    child.length = node.length + 1
                    child.endpoints[seq_id] = end
                    child.ref_seq, child.ref_idx = seq_id, end - child.length
                    child.parent = node.parent
                    node.parent.children[child.token] = child
                    active[i] = child
                else:
                    # The node's edge takes the child's first token.
                    node.length += 1
                    node.endpoints[seq_id] += 1
                    node.ref_seq, node.ref_idx = seq_id, end - node.length
                    child.length -= 1
                    child.ref_idx += 1
                    del node.children[token]
                    child.token = self.seqs[child.ref_seq][child.ref_idx]
                    node.children[child.token] = child
            elif child.length == 1:
                del node.endpoints[seq_id]
                child.count += 1
                child.endpoints[seq_id] = end
                child.ref_seq, child.ref_idx = seq_id, end - 1
                active[i] = child
            else:
                # Split the child's edge after its first token; the suffix ends at the split.
                new = Node(token, node, child.count + 1, 1, seq_id, end - 1)
                new.endpoints[seq_id] = end
                child.token = self.seqs[child.ref_seq][child.ref_idx + 1]
                child.parent = new
                child.length -= 1
                child.ref_idx += 1
                new.children[child.token] = child
                node.children[token] = new
                del node.endpoints[seq_id]
                active[i] = new

    def remove(self, seq_id: int) -> None:
        """Take sequence `seq_id`'s suffixes out of the tree (its counts, its nodes)."""
        seq = self.seqs[seq_id]
        root = self.root
        for start in range(len(seq)):
            node, idx, path = root, start, []
            root.count -= 1
            while idx < len(seq):
                child = node.children.get(seq[idx])
                if child is None:
                    break
                child.count -= 1
                if child.count == 0:
                    del node.children[seq[idx]]
                    break
                child.endpoints.pop(seq_id, None)
                idx += child.length
                node = child
                path.append(node)
            # The node the suffix ended in may now be passed through by its one child's
            # suffixes only: fuse the two edges.
            if node is not root and len(node.children) == 1:
                (only,) = node.children.values()
                if node.count == only.count:
                    only.token = node.token
                    only.length += node.length
                    only.ref_idx -= node.length
                    only.parent = node.parent
                    node.parent.children[only.token] = only
                    path[-1] = node = only
            self._rereference(path, node, seq_id)
        del self.seqs[seq_id]
        del self._active[seq_id]

    def _rereference(self, path: list[Node], node: Node, seq_id: int) -> None:
        """Point the path's edges that read their tokens from `seq_id` at another sequence
        that holds them: one ending in a leaf below `node`."""
        leaf, distance = node, 0
        while leaf.children:
            leaf = next(iter(leaf.children.values()))
            distance += leaf.length
        if not leaf.endpoints or seq_id in leaf.endpoints:
            return  # a later suffix of seq_id ends there and fixes the path then
        ref_seq, ref_end = next(iter(leaf.endpoints.items()))
        ref_idx = ref_end - distance
        for n in reversed(path):
            ref_idx -= n.length
            if n.ref_seq == seq_id:
                n.ref_seq, n.ref_idx = ref_seq, ref_idx

    # ---- proposing ------------------------------------------------------------------
    def match(self, pattern: list[int]) -> tuple[Node, int] | None:
        """Where `pattern` ends in the tree: (node, tokens of its edge matched); None if absent."""
        node, idx = self.root, 0
        for token in pattern:
            if idx >= node.length:
                child = node.children.get(token)
                if child is None:
                    return None
                node, idx = child, 0
            if self.seqs[node.ref_seq][node.ref_idx + idx] != token:
                return None
            idx += 1
        return node, idx

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float,
                  min_token_prob: float, max_spec_offset: float = 0.0) -> Draft:
        """The best draft to follow `context`: for each suffix of it (1 .. len - 1 tokens, up
        to max_depth) that occurs, the greedy most frequent continuation of at most
        min(max_spec_tokens, factor x match length + offset) tokens, each of estimated
        probability at least min_token_prob; the highest score wins (longer matches on ties)."""
        context = context[-self.max_depth:]
        best = Draft()
        for match_len in range(1, len(context)):
            found = self.match(context[len(context) - match_len:])
            if found is None:
                break
            limit = max(0, min(max_spec_tokens, int(match_len * max_spec_factor + max_spec_offset + 1e-6)))
            draft = self._greedy_path(*found, limit, min_token_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best

    def _greedy_path(self, node: Node, idx: int, limit: int, min_token_prob: float) -> Draft:
        draft, prob = Draft(), 1.0
        while len(draft.token_ids) < limit and prob >= min_token_prob:
            if idx < node.length:
                draft.token_ids.append(self.seqs[node.ref_seq][node.ref_idx + idx])
                draft.probs.append(prob)
                draft.score += prob
                idx += 1
                continue
            if not node.children:
                break
            # The most frequent continuation; the smaller token id on a tie (deterministic).
            child = max(node.children.values(), key=lambda c: (c.count, -c.token))
            prob *= child.count / node.count
            node, idx = child, 0
        return draft

    # ---- inspection (tests, memory figures) ------------------------------------------
    def nodes(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def counts(self) -> dict[tuple[int, ...], int]:
        """count(P) for every pattern P the tree holds, by walking each edge token by token."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[Node, tuple[int, ...]]] = [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                path = prefix
                for i in range(child.length):
                    path = (*path, self.seqs[child.ref_seq][child.ref_idx + i])
                    out[path] = child.count
                stack.append((child, path))
        return out
