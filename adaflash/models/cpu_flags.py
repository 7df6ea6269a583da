"""What the CPU says it can do, from Linux's /proc/cpuinfo: which dtypes run natively and how many rows a
product may take while each row keeps its bits."""

from __future__ import annotations

from functools import cache
from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86's two; Arm's BF16 extension
AMX_FLAGS = frozenset({"amx_bf16", "amx_tile"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags of `cpuinfo` (x86 `flags`, Arm `Features`; this machine's when None), empty where they
    cannot be read."""
    if cpuinfo is None:
        return _own_flags()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


@cache
def _own_flags() -> frozenset[str]:
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def bf16_row_chunk(flags: frozenset[str]) -> int:
    """The most rows one bf16 product takes on a CPU with these flags so that each row gets the bits it
    gets among any other rows (measured, `tests/test_cpu_lossless.py` checks the machine it runs on).

    oneDNN's AVX512-BF16 kernels kept every row's bits at any count tried (1 to 600 rows, every SmolLM2
    and Qwen3-8B weight shape, 1 and 2 threads, on an EPYC); on a CPU with AMX, SmolLM2's 49,152-row
    lm_head changes them from 33 rows (the tile kernels take over). Elsewhere bf16 is emulated or
    unmeasured: 32, the count that held on both."""
    if "avx512_bf16" in flags and not flags & AMX_FLAGS:
        return 512
    return 32
