"""The ratio statistic every coordinator benchmark prints: median(a) / median(b) with a bootstrap
95% interval, so that a run says whether the ratio is decided, not just where one sample fell."""

import random
import statistics
from collections.abc import Sequence


def ratio_interval(
    a: Sequence[float], b: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(low, median(a)/median(b), high)``: percentile bootstrap over independent resamples of
    ``a`` and ``b`` (each sample one measured step or block)."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(resamples)
    )
    return (
        ratios[int(0.025 * resamples)],
        statistics.median(a) / statistics.median(b),
        ratios[int(0.975 * resamples) - 1],
    )
