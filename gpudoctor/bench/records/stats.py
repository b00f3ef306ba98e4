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


# ---- tests of a difference (bench compare) -------------------------------------------------------------------------
# Pure stdlib: the regularized incomplete beta function by its continued fraction (modified Lentz), from which the t
# distribution's CDF follows; quantiles by bisection. tests/bench/test_compare_stats.py checks them against published
# values (t tables, the normal distribution, a textbook Welch example, Mann-Whitney exact small cases).

def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 3e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        even = m * (b - m) * x / ((a + m2 - 1) * (a + m2))
        odd = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df > 0 degrees of freedom (df need not be an integer: Welch)."""
    if math.isinf(df):
        return norm_cdf(t)
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on t_cdf; |error| < 1e-9)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return (lo + hi) / 2


def norm_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def norm_ppf(p: float) -> float:
    return _bisect(norm_cdf, p)


def _bisect(cdf, p: float) -> float:
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _mean_var(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def welch(a: list[float], b: list[float]) -> dict:
    """Welch's t test of mean(b) - mean(a) (unequal variances, Welch-Satterthwaite df): the difference, its 95 %
    interval and the two-sided p-value. Needs two or more values per side."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's t test needs two or more values per side")
    ma, va = _mean_var(a)
    mb, vb = _mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    diff = mb - ma
    se = math.sqrt(sa + sb)
    if se == 0:
        return {"diff": diff, "lo": diff, "hi": diff, "p": 0.0 if diff else 1.0, "df": len(a) + len(b) - 2,
                "se": 0.0}
    df = (sa + sb) ** 2 / ((sa * sa) / (len(a) - 1) + (sb * sb) / (len(b) - 1))
    t = diff / se
    half = t_ppf(0.975, df) * se
    return {"diff": diff, "lo": diff - half, "hi": diff + half, "p": 2 * (1 - t_cdf(abs(t), df)), "df": df, "se": se}


def mann_whitney(a: list[float], b: list[float]) -> dict:
    """The Mann-Whitney U test (Wilcoxon rank-sum), two-sided, normal approximation with the tie correction and a
    continuity correction: U of b over a and its p-value. Good from about 8 values per side."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        raise ValueError("Mann-Whitney needs values on both sides")
    allv = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks = [0.0] * len(allv)
    ties = 0.0
    i = 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1][0] == allv[i][0]:
            j += 1
        r = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = r
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r2 = sum(r for r, (_, side) in zip(ranks, allv) if side == 1)
    u = r2 - n2 * (n2 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return {"u": u, "p": 1.0}
    z = (abs(u - mu) - 0.5) / math.sqrt(var)
    return {"u": u, "p": min(1.0, 2 * (1 - norm_cdf(max(z, 0.0))))}


def bootstrap_diff(a: list[float], b: list[float], stat, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile-bootstrap interval of stat(b) - stat(a), resampling each side with replacement (seeded:
    the same data give the same interval)."""
    import random

    rng = random.Random(seed)
    ds = sorted(stat(rng.choices(b, k=len(b))) - stat(rng.choices(a, k=len(a))) for _ in range(n))
    return ds[int(0.025 * n)], ds[min(n - 1, int(0.975 * n))]


def trials_needed(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Values per side for a two-sided t test at `alpha` to detect a true difference `delta` with `power`, given the
    spread `sd` of one value (the usual (t_a/2 + t_b)^2 * 2 sd^2 / delta^2, iterated on the df); None without a
    spread or an effect."""
    if not sd or not delta or not math.isfinite(sd):
        return None
    z = 2 * (norm_ppf(1 - alpha / 2) + norm_ppf(power)) ** 2 * sd * sd / (delta * delta)
    n = max(2, math.ceil(z))
    for _ in range(100):  # the t quantiles shrink as n grows: settle on the fixed point
        df = 2 * n - 2
        nxt = max(2, math.ceil(2 * (t_ppf(1 - alpha / 2, df) + t_ppf(power, df)) ** 2 * sd * sd / (delta * delta)))
        if nxt == n:
            break
        n = nxt
    return n
