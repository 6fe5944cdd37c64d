"""The suffix tree against brute force over random token sequences: counts of every pattern,
drafts (the same greedy walk over counts taken from all suffixes), incremental updates and
removals against a tree built from scratch, and the node bound."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.spec.suffix_tree import SuffixTree

SEQS = st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=4)
DEPTH = st.integers(1, 8)


def brute_counts(seqs: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    """Occurrences of every pattern of 1 .. depth tokens."""
    counts: dict[tuple[int, ...], int] = {}
    for seq in seqs:
        for start in range(len(seq)):
            for end in range(start + 1, min(start + depth, len(seq)) + 1):
                key = tuple(seq[start:end])
                counts[key] = counts.get(key, 0) + 1
    return counts


def brute_draft(seqs, depth, context, max_spec, factor, min_prob) -> tuple[list[int], float, int]:
    """SuffixDecoding's proposal from counts alone: for each suffix of the context that occurs,
    follow the most frequent next token while the path's probability holds up."""
    counts = brute_counts(seqs, depth)
    context = context[-depth:]
    best: tuple[list[int], float, int] = ([], 0.0, 0)
    for match_len in range(1, len(context)):
        path = tuple(context[len(context) - match_len:])
        if path not in counts:
            break
        limit = max(0, min(max_spec, int(match_len * factor + 1e-6)))
        tokens, prob, score = [], 1.0, 0.0
        while len(tokens) < limit:
            options = [(counts[(*path, t)], -t) for t in range(4) if (*path, t) in counts]
            if not options:
                break
            count, neg_token = max(options)
            prob *= count / counts[path]
            if prob < min_prob:
                break
            path = (*path, -neg_token)
            tokens.append(-neg_token)
            score += prob
        if score >= best[1]:
            best = (tokens, score, match_len)
    return best


def build(seqs: list[list[int]], depth: int) -> SuffixTree:
    tree = SuffixTree(depth)
    for seq_id, seq in enumerate(seqs):
        tree.extend(seq_id, seq)
    return tree


@settings(max_examples=300, deadline=None)
@given(seqs=SEQS, depth=DEPTH)
def test_counts_are_occurrences(seqs, depth):
    tree = build(seqs, depth)
    assert tree.counts() == brute_counts(seqs, depth)
    assert tree.root.count == sum(len(s) for s in seqs)
    assert len(tree.nodes()) <= 2 * tree.num_tokens + 1  # the memory bound, whatever the depth


@settings(max_examples=300, deadline=None)
@given(seqs=SEQS, depth=DEPTH, context=st.lists(st.integers(0, 3), max_size=12),
       max_spec=st.integers(0, 8), factor=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
       min_prob=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0]))
def test_drafts_match_brute_force(seqs, depth, context, max_spec, factor, min_prob):
    draft = build(seqs, depth).speculate(context, max_spec, factor, min_prob)
    tokens, score, match_len = brute_draft(seqs, depth, context, max_spec, factor, min_prob)
    assert draft.token_ids == tokens
    assert abs(draft.score - score) < 1e-9
    assert draft.match_len == match_len
    assert len(draft.token_ids) <= max_spec


@settings(max_examples=200, deadline=None)
@given(seqs=SEQS, depth=DEPTH, order=st.randoms(use_true_random=False))
def test_interleaved_appends_equal_a_rebuild(seqs, depth, order):
    """Tokens arriving a few at a time, sequences interleaved, give the tree built at once."""
    tree, done = SuffixTree(depth), [0] * len(seqs)
    while any(n < len(s) for n, s in zip(done, seqs)):
        seq_id = order.choice([i for i, s in enumerate(seqs) if done[i] < len(s)])
        step = order.randint(1, 3)
        tree.extend(seq_id, seqs[seq_id][done[seq_id]: done[seq_id] + step])
        done[seq_id] = min(done[seq_id] + step, len(seqs[seq_id]))
    rebuilt = build(seqs, depth)
    assert tree.counts() == rebuilt.counts()
    for context in ([0, 1], [3, 3, 3], seqs[0][-5:]):
        assert tree.speculate(context, 8, 2.0, 0.1) == rebuilt.speculate(context, 8, 2.0, 0.1)


@settings(max_examples=300, deadline=None)
@given(seqs=SEQS, depth=DEPTH, removed=st.sets(st.integers(0, 3)),
       later=st.lists(st.integers(0, 3), max_size=10))
def test_removal_takes_out_exactly_that_sequence(seqs, depth, removed, later):
    tree = build(seqs, depth)
    for seq_id in sorted(removed):
        if seq_id < len(seqs) and seqs[seq_id]:
            tree.remove(seq_id)
    kept = [s for i, s in enumerate(seqs) if i not in removed]
    assert tree.counts() == brute_counts(kept, depth)
    # The edges read their tokens from sequences still held, and the tree still grows right.
    tree.extend(99, later)
    assert tree.counts() == brute_counts([*kept, later], depth)
    assert len(tree.nodes()) <= 2 * tree.num_tokens + 1


def test_a_repeated_tool_call_is_proposed_whole():
    call = [5, 6, 7, 8, 9, 10, 11]
    tree = build([[1, *call, 2, 3, *call, 4]], depth=24)
    draft = tree.speculate([0, 5, 6, 7], max_spec_tokens=16, max_spec_factor=2.0, min_token_prob=0.1)
    # 2 and 4 follow the call once each: the smaller id, at one half; 2 x 3 tokens at most.
    assert draft.token_ids == [8, 9, 10, 11, 2, 3]
    assert draft.probs == [1.0] * 4 + [0.5] * 2
    assert draft.match_len == 3
