"""The cyclic garbage collector in a serving process: what lives as long as a model is frozen.

CPython's full collection (its oldest generation) walks every object it tracks while
holding the GIL. A server that imported numpy, numba, starlette and trio and loaded its
models tracks about 150,000 of them, and a full collection takes 30-37 ms on the 2-core
VM this project is measured on: every request in flight waits that long, whenever the
collector decides. With 1,100 live VAD streams those pauses were the whole tail:
p99 chunk latency 85-116 ms against 18-26 ms with them gone (docs/performance.md,
"Session 19").

So once a model is loaded (and with it the modules its load imported: about 139,000 of
those objects are the imports', 8,000 a Piper model's), :func:`settle` collects once and
freezes what is alive (``gc.freeze``: the permanent generation, which collections never
walk); later collections walk only objects made since, the requests' own. Frozen objects
are still freed by reference counting when their last reference goes; only garbage in
reference cycles among them waits, for the next :func:`settle`, which unfreezes first:
so what an unloaded model leaves in cycles is collected at the next load, and memory
stays bounded over load and unload cycles. Each load costs one full collection (about
30 ms), next to a load's seconds. ``VOXPOOL_GC_FREEZE=0`` in the environment turns this
off.
"""

from __future__ import annotations

import gc
import os

ENABLED = os.environ.get("VOXPOOL_GC_FREEZE", "1") != "0"
"""Whether loads and unloads settle the collector (unless ``VOXPOOL_GC_FREEZE=0``)."""


def settle() -> None:
    """After a model's load: unfreezes what an earlier call froze, collects once (cycles
    left by models unloaded since go too) and freezes every object alive."""
    if ENABLED:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
