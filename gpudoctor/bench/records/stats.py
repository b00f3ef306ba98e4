"""Spread over trials: the mean and its 95 % confidence interval with Student's t distribution (no scipy).

`t975(df)` is the 0.975 quantile of t with `df` degrees of freedom: the table below for df 1..30 (four decimals, the
standard values; tests/bench/test_stats.py checks every entry against a numerical integration of the t density), then
40, 60, 120 and infinity, interpolated linearly in 1/df between them (the textbook rule; error < 1e-3).
"""

from __future__ import annotations

import math

_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)
_T975_TAIL = ((30, 2.0423), (40, 2.0211), (60, 2.0003), (120, 1.9799), (math.inf, 1.95996))


def t975(df: int) -> float:
    """The two-sided 95 % critical value of Student's t with df >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= 30:
        return _T975[df - 1]
    for (d0, t0), (d1, t1) in zip(_T975_TAIL, _T975_TAIL[1:]):
        if df <= d1:
            x0, x1, x = 1 / d0, (0.0 if d1 == math.inf else 1 / d1), 1 / df
            return t0 + (t1 - t0) * (x0 - x) / (x0 - x1)
    return _T975_TAIL[-1][1]


def mean_ci(values: list[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, half-width of its 95 % confidence interval, n) over the values that are not None; the half-width is
    None for fewer than two values (one trial has no spread)."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if not n:
        return None, None, 0
    m = sum(xs) / n
    if n < 2:
        return m, None, n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, t975(n - 1) * sd / math.sqrt(n), n


def fmt_ci(mean: float | None, half: float | None, nd: int = 1) -> str:
    """`26.2 ± 0.4` (the seed's `26.2 +/- 0.4 tok/s`), the mean alone without a spread, `—` without a value."""
    if mean is None:
        return "—"
    return f"{mean:.{nd}f}" if half is None else f"{mean:.{nd}f} ± {half:.{nd}f}"
