"""The statistics of `bench compare` (gpudoctor.bench.records.stats), stdlib only, against published values."""

from __future__ import annotations

import math

import pytest

from gpudoctor.bench.records import stats


@pytest.mark.parametrize("p,df,want", [
    (0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.975, 10, 2.2281), (0.975, 30, 2.0423), (0.95, 10, 1.8125),
    (0.99, 5, 3.3649), (0.8, 4, 0.9410), (0.9, 2, 1.8856), (0.975, 120, 1.9799)])
def test_t_quantiles_match_the_tables(p, df, want):
    assert stats.t_ppf(p, df) == pytest.approx(want, abs=1e-4)
    assert stats.t_cdf(want, df) == pytest.approx(p, abs=1e-5)


def test_t_table_and_quantile_agree_for_every_tabled_df():
    for df in range(1, 31):
        assert stats.t_ppf(0.975, df) == pytest.approx(stats.t975(df), abs=1e-4)


def test_normal_and_incomplete_beta_known_values():
    assert stats.norm_ppf(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert stats.norm_cdf(1.0) == pytest.approx(0.841345, abs=1e-6)
    assert stats.betainc(2, 3, 0.5) == pytest.approx(0.6875, abs=1e-12)  # 11/16
    assert stats.betainc(1, 1, 0.3) == pytest.approx(0.3, abs=1e-12)
    assert stats.t_cdf(0.0, 7) == pytest.approx(0.5)


def test_welch_matches_the_textbook_example():
    # Welch's t test, Wikipedia example 1: t = -2.46, df = 24.9, p = 0.021 (B - A here, so t > 0)
    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    w = stats.welch(a, b)
    assert w["diff"] / w["se"] == pytest.approx(2.46, abs=0.01)
    assert w["df"] == pytest.approx(24.9, abs=0.1)
    assert w["p"] == pytest.approx(0.021, abs=0.001)
    assert w["lo"] > 0  # significant: the interval excludes 0
    with pytest.raises(ValueError):
        stats.welch([1.0], [2.0, 3.0])


def test_mann_whitney_normal_approximation():
    # scipy.stats.mannwhitneyu([1..5], [6..10], method="asymptotic") -> p = 0.01219
    r = stats.mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert r["u"] == 25 and r["p"] == pytest.approx(0.01219, abs=1e-4)
    assert stats.mann_whitney([1, 2, 3], [1, 2, 3])["p"] == pytest.approx(1.0)


def test_bootstrap_is_seeded_and_covers_the_difference():
    a = [10 + (i % 7) * 0.1 for i in range(40)]
    b = [x + 1 for x in a]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    lo, hi = stats.bootstrap_diff(a, b, mean)
    assert lo < 1 < hi and lo > 0.8 and hi < 1.2
    assert (lo, hi) == stats.bootstrap_diff(a, b, mean)


@pytest.mark.parametrize("sd,delta,want", [(1, 1, 17), (1, 0.5, 64), (1, 0.8, 26)])
def test_trials_needed_matches_power_tables(sd, delta, want):
    # two-sided alpha 0.05, power 0.8, per group (G*Power / Cohen): d = 1 -> 17, 0.5 -> 64, 0.8 -> 26
    assert stats.trials_needed(sd, delta) == want
    assert stats.trials_needed(0, 1) is None and stats.trials_needed(1, 0) is None
