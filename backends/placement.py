"""Where a split's threads run: the caller stays on its core, the lanes helping it on the others.

A split (:meth:`backends.parallel.CoreShare.run`, the spinning helpers of
:mod:`backends.handoff`) wakes threads that slept since the last one. After a short
sleep the kernel puts a woken thread back on the core it left, which is idle; after a
longer one (a request arriving at an idle server) it may put it on the caller's own core,
where it waits behind the caller until the load balancer moves it, and the split runs on
one core. Measured on a 2-core Zen 5 VM (docs/performance.md, "Session 18"): Piper's short
sentence at two threads took 50.7-50.9 ms run back to back and 71.4-76.8 ms after 0.5 s
idle, as long as at one thread (70.7-71.7), with every thread free to run anywhere; with
the caller held on its core and the other threads on the other one, 54-57 ms either way.

So while a split runs, :func:`keep_here` holds the caller on the core it is on, and each
lane that joins it moves itself to the caller's other allowed CPUs (:func:`move_to`).
Which thread computes which piece never changes a result. The CPUs allowed are the
caller's own mask at the time of the split (what an operator set with ``taskset``, even
on a running server; a thread created while its creator is held inherits one CPU, so
lanes are told the set rather than reading their own), and the caller gets back the mask
it had. Where the process has one CPU, or the platform has no ``sched_getcpu`` and
``sched_setaffinity`` (not Linux), nothing moves; where the system refuses the call
(``EPERM`` under a seccomp filter, ``ENOSYS``), placement turns itself off at the first
refusal. ``VOXPOOL_PLACEMENT=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _sched_getcpu() -> Callable[[], Any] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):  # pragma: no cover - not glibc or musl
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    getcpu: Callable[[], Any] = fn
    return getcpu


_GETCPU = _sched_getcpu()
ENABLED = (
    _GETCPU is not None
    and hasattr(os, "sched_setaffinity")
    and os.environ.get("VOXPOOL_PLACEMENT", "1") != "0"
)
"""Whether splits place their threads (Linux, unless ``VOXPOOL_PLACEMENT=0``)."""

_local = threading.local()  # .now: the CPUs it was last moved onto; .held_from: see allowed()
_REFUSED = frozenset({errno.EPERM, errno.EACCES, errno.ENOSYS})
_denied = False  # the system refused a call: placement is off from then on


def enabled() -> bool:
    """Whether splits place their threads now (:data:`ENABLED`, and no call refused yet)."""
    return ENABLED and not _denied


def current_cpu() -> int | None:
    """The CPU the calling thread runs on now, or None where it cannot be told."""
    if not enabled() or _GETCPU is None:
        return None
    cpu = int(_GETCPU())
    return cpu if cpu >= 0 else None


def allowed() -> frozenset[int]:
    """The CPUs the calling thread may run on: its mask, or while :func:`keep_here` holds it,
    the mask it had before."""
    held: frozenset[int] | None = getattr(_local, "held_from", None)
    return held if held is not None else frozenset(os.sched_getaffinity(0))


def _affinity(tid: int, cpus: frozenset[int]) -> bool:
    """Thread ``tid`` (0: the caller) onto ``cpus``; False where that failed (a CPU gone
    offline, a cpuset changed: it stays where it was; refused: placement turns off)."""
    global _denied
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as error:
        if error.errno in _REFUSED:
            _denied = True
        return False
    return True


def _set(cpus: frozenset[int]) -> bool:
    """The calling thread onto ``cpus`` (:func:`_affinity`)."""
    _local.now = None
    return _affinity(0, cpus)


def move_to(cpus: frozenset[int] | None) -> None:
    """Moves the calling thread (a lane joining a split) onto ``cpus``, what the caller's
    :func:`keep_here` yielded (nothing for None; no system call when it was moved there
    last)."""
    if cpus and enabled() and getattr(_local, "now", None) != cpus and _set(cpus):
        _local.now = cpus


@contextmanager
def keep_here() -> Iterator[frozenset[int] | None]:
    """Holds the calling thread on the CPU it runs on for the block, then gives it back the
    mask it had; yields the other CPUs it may run on (where its lanes go: :func:`move_to`),
    or None when nothing is held (see the module doc)."""
    cpu = current_cpu()
    if cpu is None or not enabled() or getattr(_local, "held_from", None) is not None:
        yield None
        return
    before = frozenset(os.sched_getaffinity(0))
    rest = before - {cpu}
    if not rest or cpu not in before:
        yield None
        return
    _local.held_from = before  # first: an interrupt from here on still gives the mask back
    try:
        if not _set(frozenset({cpu})):
            _local.held_from = None
            yield None
            return
        yield rest
    finally:
        if getattr(_local, "held_from", None) is not None:
            _local.held_from = None
            _set(before)


def others(cpu: int | None) -> frozenset[int] | None:
    """The calling thread's allowed CPUs (:func:`allowed`) other than ``cpu``; None when there
    are none (or ``cpu`` is None, or placement is off)."""
    if cpu is None or not enabled():
        return None
    return (allowed() - {cpu}) or None


def move(tid: int, cpus: frozenset[int]) -> bool:
    """Moves the thread ``tid`` (a native id) onto ``cpus``; False where that failed."""
    return _affinity(tid, cpus)
