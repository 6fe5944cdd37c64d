"""Pearson's chi-square tests (scipy is not a dependency: the statistic is a sum, the p-value
the regularised upper incomplete gamma function torch ships)."""

import torch


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with `dof` degrees of freedom."""
    a = torch.tensor(dof / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(statistic / 2, dtype=torch.float64)))


def goodness_of_fit(counts: list[int], probs: list[float], min_expected: float = 5.0) -> float:
    """p-value of observed counts against expected probabilities; categories expected fewer than
    `min_expected` times are pooled into one (the test's usual validity condition)."""
    total = sum(counts)
    observed, expected, pooled_o, pooled_e = [], [], 0.0, 0.0
    for o, p in zip(counts, probs):
        if p * total >= min_expected:
            observed.append(o)
            expected.append(p * total)
        else:
            pooled_o += o
            pooled_e += p * total
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(max(pooled_e, 1e-12))
    if len(observed) < 2:
        raise ValueError("fewer than two categories left after pooling: no test possible")
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return chi2_sf(statistic, len(observed) - 1)


def homogeneity(a: dict, b: dict, min_count: int = 10) -> float:
    """p-value that two samples of categories come from one distribution (2 x n table);
    categories seen fewer than `min_count` times in both together are pooled."""
    keys = sorted(set(a) | set(b), key=str)
    rows: list[tuple[float, float]] = []
    rare = [0.0, 0.0]
    for key in keys:
        x, y = a.get(key, 0), b.get(key, 0)
        if x + y >= min_count:
            rows.append((x, y))
        else:
            rare[0] += x
            rare[1] += y
    if sum(rare):
        rows.append((rare[0], rare[1]))
    if len(rows) < 2:
        raise ValueError("fewer than two categories left after pooling: no test possible")
    n_a, n_b = sum(r[0] for r in rows), sum(r[1] for r in rows)
    total = n_a + n_b
    statistic = 0.0
    for x, y in rows:
        column = x + y
        for observed, size in ((x, n_a), (y, n_b)):
            expected = column * size / total
            statistic += (observed - expected) ** 2 / expected
    return chi2_sf(statistic, len(rows) - 1)
