"""The GPU `sglang validate` checks against when --gpu is not given: this machine's, read through NVML.

read_nvml is the whole real reader (pynvml, imported only here and only when called); pick() is the choice, pure, so
it is tested with any list of cards. No NVML (no nvidia-ml-py, no driver, no GPU) means no choice: validate then
behaves as it always did without --gpu.
"""

from __future__ import annotations

from typing import Callable

from gpudoctor.findings import Finding
from gpudoctor.sglang.rules import F, GPUS, Gpu

SOURCE = "gpudoctor (NVML on this machine)"


def read_nvml() -> list[Gpu] | None:
    """Each GPU of this machine as NVML names it (name, memory.total MiB, SM); None when NVML cannot answer."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        cards = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            cards.append(Gpu(name.decode() if isinstance(name, bytes) else str(name),
                             pynvml.nvmlDeviceGetMemoryInfo(h).total >> 20, major * 10 + minor))
        return cards
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def pick(cards: list[Gpu] | None) -> tuple[str | None, Finding | None]:
    """The --gpu key for this machine's cards and the finding that says so; (None, why or None) when there is no
    one known model to check against (then validate checks as without --gpu)."""
    if not cards:
        return None, None
    seen = sorted({c.name for c in cards})
    what = f"{len(cards)} x {cards[0].name} ({cards[0].memory_mib} MiB, SM{cards[0].sm})" if len(seen) == 1 \
        else ", ".join(seen)
    if len(seen) > 1:
        return None, F("sglang.gpu.this_machine", "info", f"this machine has different GPUs ({what}): checked without "
                       "a GPU model", source=SOURCE, fix="pass --gpu for the one the server runs on")
    key = next((k for k, g in GPUS.items() if g.name == seen[0]), None)
    if key is None:
        return None, F("sglang.gpu.this_machine", "info", f"this machine's GPU is {what}, not one --gpu knows "
                       f"({', '.join(sorted(GPUS))}): checked without a GPU model", source=SOURCE,
                       fix="pass --gpu-mem-gib for its memory")
    return key, F("sglang.gpu.this_machine", "info", f"GPU: --gpu {key}, read from this machine (NVML: {what})",
                  source=SOURCE, fix="pass --gpu to check for another GPU", gpu=key, cards=len(cards))


def this_machine(reader: Callable[[], list[Gpu] | None] = read_nvml) -> tuple[str | None, Finding | None]:
    """pick() over what `reader` (NVML) finds here."""
    return pick(reader())
