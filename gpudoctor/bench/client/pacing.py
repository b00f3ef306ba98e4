"""Open-loop arrivals: when each request of a request-rate level is due, and a pacer that sends it on time.

asyncio's timers are not good enough above a few hundred requests per second: the selector's timeout is rounded up to
whole milliseconds (selectors.EpollSelector.select: math.ceil(timeout * 1e3) * 1e-3), so every `asyncio.sleep` or
`call_at` wakes up to 1 ms late, and a schedule paced by sleeps drifts (AIPerf documents ~1 ms rounding above 500
req/s). The TimerfdPacer arms a Linux timerfd (CLOCK_MONOTONIC, absolute deadline, nanosecond resolution) and lets
the event loop wait on its file descriptor: epoll returns when the kernel timer fires, not on the next millisecond.
Where timerfd is not available (not Linux, or no libc), SpinPacer sleeps to 1.5 ms before the deadline and then
yields to the loop (asyncio.sleep(0)) until it is reached. bench/pacing.py measures all three.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import random
import time

POISSON, CONSTANT = "poisson", "constant"
ARRIVALS = (POISSON, CONSTANT)


def arrival_offsets(n: int, rate: float, arrival: str = POISSON, seed: int = 0) -> list[float]:
    """Seconds from the level's start at which each of n requests is due: constant 1/rate gaps, or a seeded Poisson
    process (exponential gaps of mean 1/rate; the first request at 0 either way)."""
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError(f"request rate must be a positive number, got {rate!r}")
    if arrival == CONSTANT:
        return [i / rate for i in range(n)]
    if arrival != POISSON:
        raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


class SleepPacer:
    """Plain asyncio.sleep until the deadline: the baseline, late by up to ~1 ms per wake-up."""

    name = "asyncio.sleep"

    async def wait_until(self, deadline: float) -> float:
        delay = deadline - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        return time.perf_counter()

    def close(self) -> None:
        pass


class SpinPacer:
    """Sleep to `margin` before the deadline, then yield to the loop until it is reached (other tasks keep running)."""

    name = "sleep+spin"

    def __init__(self, margin: float = 0.0015):
        self.margin = margin

    async def wait_until(self, deadline: float) -> float:
        delay = deadline - time.perf_counter() - self.margin
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        while now < deadline:
            await asyncio.sleep(0)
            now = time.perf_counter()
        return now

    def close(self) -> None:
        pass


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC, _TFD_TIMER_ABSTIME = 1, 1
_TFD_NONBLOCK, _TFD_CLOEXEC = os.O_NONBLOCK, getattr(os, "O_CLOEXEC", 0o2000000)


class TimerfdPacer:
    """An absolute-deadline timerfd watched by the event loop (Linux). time.perf_counter() is CLOCK_MONOTONIC there,
    so deadlines need no conversion."""

    name = "timerfd"

    def __init__(self):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.POINTER(_Itimerspec)]
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
            os.close(fd)
            raise OSError("time.perf_counter is not CLOCK_MONOTONIC here")
        self.fd = fd

    async def wait_until(self, deadline: float) -> float:
        now = time.perf_counter()
        if deadline <= now:
            return now
        spec = _Itimerspec()
        sec = math.floor(deadline)
        spec.it_value.tv_sec, spec.it_value.tv_nsec = sec, int((deadline - sec) * 1e9)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def fired() -> None:
            try:
                os.read(self.fd, 8)
            except BlockingIOError:
                return
            if not fut.done():
                fut.set_result(None)

        loop.add_reader(self.fd, fired)
        try:
            await fut
        finally:
            loop.remove_reader(self.fd)
        return time.perf_counter()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def best_pacer():
    """The most accurate pacer this machine offers: timerfd on Linux, else sleep+spin."""
    try:
        return TimerfdPacer()
    except (OSError, AttributeError, TypeError):
        return SpinPacer()


def rate_error(scheduled: list[float], actual: list[float]) -> dict:
    """How well a run kept its schedule: achieved vs intended rate over the same requests (relative error), and
    each send's lateness (p50, p99, max, in microseconds)."""
    from gpudoctor.bench.records.results import percentile

    n = len(actual)
    if n < 2:
        return {"rate_error": None, "late_us_p50": None, "late_us_p99": None, "late_us_max": None}
    want = (n - 1) / (scheduled[-1] - scheduled[0]) if scheduled[-1] > scheduled[0] else None
    got = (n - 1) / (actual[-1] - actual[0]) if actual[-1] > actual[0] else None
    late = [(a - s) * 1e6 for s, a in zip(scheduled, actual)]
    return {"rate_error": (got / want - 1.0) if want and got else None, "late_us_p50": percentile(late, 50),
            "late_us_p99": percentile(late, 99), "late_us_max": max(late)}
