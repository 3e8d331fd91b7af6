"""Chi-square goodness of fit for "these draws follow that distribution" tests.

Shared by the synthetic verifier tests and the real-model lossless tests; import
it as ``from stats import chi_square_pvalue`` (pytest puts tests/ on sys.path
because tests/conftest.py lives there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

from scipy import stats

MIN_EXPECTED = 5.0  # below this expected count a cell is pooled, as the chi-square approximation needs


def chi_square_pvalue(draws: Iterable[Hashable], probs: Mapping[Hashable, float]) -> float:
    """p-value of the hypothesis that ``draws`` are independent samples from ``probs``.

    ``probs`` maps outcomes to their exact probabilities. It may list only some
    outcomes: the mass it leaves out (1 - sum) is one "other" cell that every
    unlisted draw falls into, so when the listed outcomes sum to 1 a single
    unlisted draw rejects the hypothesis (p-value 0). Cells whose expected count
    is below MIN_EXPECTED are pooled with "other".
    """
    counts = Counter(draws)
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no draws to test")
    total = sum(probs.values())
    if total > 1.0 + 1e-6 or any(p < 0 for p in probs.values()):
        raise ValueError(f"not a probability distribution (sums to {total})")
    big = [o for o, p in probs.items() if p * n >= MIN_EXPECTED]
    observed = [counts[o] for o in big]
    expected = [probs[o] * n for o in big]
    pooled_observed, pooled_expected = n - sum(observed), max(n - sum(expected), 0.0)
    if pooled_expected < 1e-9 * n:
        if pooled_observed > 0:  # drew an outcome of probability 0
            return 0.0
    elif pooled_expected >= MIN_EXPECTED or not big:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    else:  # too small to stand alone: fold it into the smallest cell
        smallest = min(range(len(big)), key=expected.__getitem__)
        observed[smallest] += pooled_observed
        expected[smallest] += pooled_expected
    if len(observed) < 2:  # one possible outcome and every draw is it
        return 1.0
    # Renormalise away float drift so scipy's sum check passes.
    scale = sum(observed) / sum(expected)
    return float(stats.chisquare(observed, [e * scale for e in expected]).pvalue)
