"""Memory measures of the model memory tests (Linux: RSS from /proc)."""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def held_and_grown(make: Callable[[], T]) -> tuple[T, int, int]:
    """``make()``'s result, the Python bytes it still holds after a collection (tracemalloc)
    and the RSS growth it caused; everything is collected first."""
    gc.collect()
    rss_before = rss_bytes()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        made = make()
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return made, held - base, rss_bytes() - rss_before


def peak_of(make: Callable[[], T]) -> tuple[T, int]:
    """``make()``'s result and the most Python bytes (numpy's arrays included) it had allocated
    at once, over what was allocated before (tracemalloc); everything is collected first."""
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        made = make()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return made, peak - base
