"""click types for every numeric option of every command: finite, in range, the option named when it is not.

click.FloatRange lets nan, inf and 1e400 (which float() reads as inf) through; an int option without an upper bound takes
10**30 and crashes later (a thread pool, a sleep, a struct). Every float option is `Finite(...)`, every int option has an
upper bound (`Count(...)`), every comma-separated list of numbers is `NumberList(...)`. A bad value is a click usage
error: the CLI prints one line naming the option and exits 3 (gpudoctor.cli._run). tests/core/test_numeric_options.py
walks the whole click tree and feeds every one of them nan, inf, -inf, 1e400 and a huge integer.
"""

from __future__ import annotations

import math

import click

# Far beyond any real count (tokens, GPUs, requests, threads) and still small enough for every C API it reaches.
BIG = 2**31 - 1


class Finite(click.FloatRange):
    """A finite float in [min, max] (either end optional, open or closed)."""

    name = "number"

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


class Count(click.IntRange):
    """An integer in [min, max]; max is required (default BIG). human=True also takes SGLang's 32k / 25.6k / 32Ki."""

    name = "integer"

    def __init__(self, min: int | None = 0, max: int | None = BIG, *, human: bool = False, **kw):
        super().__init__(min=min, max=BIG if max is None else max, **kw)
        self.human = human

    def convert(self, value, param, ctx):
        if self.human and isinstance(value, str):
            from gpudoctor.sglang.argparser import human_readable_int

            v = human_readable_int(value)
            if v is None:
                self.fail(f"{value!r} is not an integer (32768, 32k, 25.6k, 32Ki)", param, ctx)
            value = v
        return super().convert(value, param, ctx)


class NumberList(click.ParamType):
    """Comma-separated numbers (int or float), each finite and in [min, max] (min open with min_open)."""

    def __init__(self, kind=int, min: float | None = None, max: float | None = BIG, *, min_open: bool = False):
        self.kind, self.min, self.max, self.min_open = kind, min, max, min_open
        self.name = "integers" if kind is int else "numbers"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        out = []
        for raw in str(value).split(","):
            if not raw.strip():
                continue
            try:
                v = self.kind(raw.strip())
            except (ValueError, OverflowError):
                self.fail(f"{value!r}: {raw.strip()!r} is not {'an integer' if self.kind is int else 'a number'}",
                          param, ctx)
            if not math.isfinite(v):
                self.fail(f"{value!r}: {raw.strip()!r} is not a finite number", param, ctx)
            below = self.min is not None and (v <= self.min if self.min_open else v < self.min)
            if below or (self.max is not None and v > self.max):
                lo = "" if self.min is None else f"{'>' if self.min_open else '>='} {self.min:g}"
                hi = "" if self.max is None else f"<= {self.max:g}"
                self.fail(f"{value!r}: {raw.strip()} is not {' and '.join(x for x in (lo, hi) if x)}", param, ctx)
            out.append(v)
        if not out:
            self.fail(f"{value!r} names no number", param, ctx)
        return out


def finite(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False):
    """A click type for a number flag: finite (NaN and inf are refused, which click.FloatRange lets through) and in
    range."""
    return Finite(min=lo, max=hi, min_open=lo_open, max_open=hi_open)


def seconds(lo: float = 0.0, hi: float = 86400.0):
    """A click type for a duration flag: a finite number of seconds in [lo, hi]."""
    return finite(lo, hi)
