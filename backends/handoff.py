"""A decoding step's products and cross-attention split over cores by spinning helper threads.

A Whisper decoding step of one request is about 25 products of 0.6-2.4 MB weights and
four cross-attentions over 4.6 MB of keys and values, each a few tens to a few
hundred microseconds, memory-bound: two cores read them faster than one (the layer
products in 0.8-0.9 of the time, ``bench/handoff.py``). Handing a piece to a thread
pool's worker costs 70-100 us on the development VM (a futex wake-up and the GIL),
about what a piece saves, so the step used to run on one core beside an idle one.

Here the hand-over is a word in shared memory. Helper threads wait in compiled code,
without the GIL, spinning on a job board (:data:`BOARD_WORDS` int64); a caller (the
*master*) writes a job, publishes it with one atomic store, and then takes pieces
itself like any helper: each piece is claimed with a compare-and-swap on one word
(the job's generation, its piece count and the next piece), so a helper that is late,
or never scheduled, takes fewer pieces or none, and the master waits only for pieces a
helper has claimed (what :meth:`backends.parallel.CoreShare.run` does with its queue,
at about a microsecond instead of 70-100). A helper that is preempted in a piece it
claimed holds the master up until it runs again (as a pool worker would). A job names
its lanes: helpers ``0`` to ``lanes - 2`` take part, the others leave it alone. A
helper that finds no new job for :data:`IDLE_CYCLES` (about a millisecond) goes back
to sleep on its event, which the next master that needs it sets without waiting; woken,
it joins that job if pieces are left, and the jobs after it.

A piece computes what the kernels compute alone (:func:`backends.kernels.panel_rows`,
:func:`backends.kernels.attend_head`), on whatever thread: results have the same bits
on one core or several. Operands are checked before a job is published, and a piece
neither allocates nor raises. One master at a time: a caller that finds the board in
use gets False and runs its pieces another way.

Only on x86-64 (the spin loop's ``pause``) and where the caller has more than one
core (:data:`backends.parallel.SHARE`).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from numba.core import types
from numba.np.numpy_support import carray as _carray

from backends import kernels, placement
from backends.intrinsics import HALVES
from backends.intrinsics import X86 as _X86
from backends.intrinsics import add as _add
from backends.intrinsics import call as _call
from backends.intrinsics import cycles as _cycles
from backends.intrinsics import floats as _floats
from backends.intrinsics import halves as _halves
from backends.intrinsics import ints as _ints
from backends.intrinsics import load as _load
from backends.intrinsics import pause as _pause
from backends.intrinsics import sgemm as _sgemm
from backends.intrinsics import store as _store
from backends.intrinsics import swap as _swap

BOARD_WORDS = 64
WORD, DONE, AWAKE, STOP, KIND, COUNT, LANES, TAKEN, YIELD = 0, 8, 16, 24, 32, 33, 34, 56, 60
"""Board slots (int64): the claim word (generation << 32 | pieces << 16 | next piece) and
the finished pieces' count each on its own cache line, from :data:`AWAKE` one flag a
helper (1 while it spins), the stop flag,
then the job: its kind, its piece count, its lanes (helpers ``0 .. lanes - 2`` take part)
and its arguments (:data:`ARGS` on); from :data:`TAKEN` the pieces each helper took (all
jobs); at :data:`YIELD` the address of the C library's ``sched_yield`` (0: none)."""
ARGS = 35
PRODUCT, ATTENTION, CONV = 1, 2, 3
"""Job kinds: rows by a packed weight's panels, one-query attention heads, a convolution's
output rows as per-tap SGEMMs (:meth:`Helpers.conv`)."""

IDLE_CYCLES = 1 << 22
"""Cycles (``readcyclecounter``: about 1.4 ms at 3 GHz) a helper spins with no new job
before it sleeps: longer than the host work between a step's products and between
steps, short enough that a finished request leaves no core spinning."""

MAX_HELPERS = 3
"""Helper threads at most (a step's pieces are 0.6-80 MB of weights: four cores read
them about as fast as more)."""

YIELD_EVERY = 1 << 10
"""Spins (``pause``) between two ``sched_yield`` calls of a waiting thread, about 20-50 us:
on an idle core the call returns at once (about a microsecond); on a core that other
runnable threads share, it lets them run instead of the spin (a helper spinning between
jobs, or a caller waiting for a helper's piece, would otherwise take its time slice
from the caller's own work or from the helper it waits for)."""

_PIECES = (1 << 16) - 1
_GENERATIONS = (1 << 31) - 1
MAX_PIECES = _PIECES
"""Pieces a job has at most (its count and next piece are 16 bits of the claim word)."""


carray = cast(Callable[..., Any], _carray)  # numba's stub types its shape as 2-D


@kernels.compiled
def _address(array: Any) -> Any:  # pragma: no cover - compiled
    """The address of an array's first element, as an int64."""
    return np.int64(array.ctypes.data)


@kernels.compiled
def _slot(board: Any, index: Any) -> Any:  # pragma: no cover - compiled
    """The address of the board's slot ``index``."""
    return _address(board) + 8 * index


def _halves_product(
    x: Any, address: Any, count: Any, bias: Any, out: Any, lo: Any, hi: Any
) -> None:  # pragma: no cover - compiled
    """:func:`backends.kernels.panel_rows` by the panels of halves' bits at ``address``."""
    halves = carray(_halves(address), (count, x.shape[1], kernels.PANEL))
    kernels.panel_rows(x, halves, bias, out, lo, hi)


def _no_halves(
    x: Any, address: Any, count: Any, bias: Any, out: Any, lo: Any, hi: Any
) -> None:  # pragma: no cover - compiled
    """Where halves do not convert by an instruction nothing posts them (and compiling their
    conversion would link a helper numba lacks)."""


_halves_rows = kernels.compiled(_halves_product if HALVES else _no_halves)


@kernels.compiled
def _piece(board: Any, piece: Any) -> None:  # pragma: no cover - compiled
    """Runs piece ``piece`` of the board's job. Nothing in it allocates or raises (the job's
    operands were checked, its scratch is one of them): a helper always finishes a piece
    it claimed."""
    a = board[ARGS:]
    if board[KIND] == PRODUCT:
        rows, depth, count, cols = a[1], a[2], a[4], a[7]
        x = carray(_floats(a[0]), (rows, depth))
        bias = carray(_floats(a[5]), (count * kernels.PANEL,))
        out = carray(_floats(a[6]), (rows, cols))
        part = carray(_ints(a[8]), (board[COUNT], 4))[piece]
        r0, r1 = part[0], part[1]
        if a[9]:  # halves' bits (posted only where HALVES)
            _halves_rows(x[r0:r1], a[3], count, bias, out[r0:r1], part[2], part[3])
        else:
            panels = carray(_floats(a[3]), (count, depth, kernels.PANEL))
            kernels.panel_rows(x[r0:r1], panels, bias, out[r0:r1], part[2], part[3])
    elif board[KIND] == CONV:
        _conv_rows(a, piece)
    else:
        members, heads, dim, keys = a[1], a[4], a[5], a[6]
        m, h = piece // heads, piece % heads
        q = carray(_floats(a[0]), (members, heads, dim))
        kt = carray(_floats(carray(_ints(a[2]), (members,))[m]), (heads, dim, keys))
        v = carray(_floats(carray(_ints(a[3]), (members,))[m]), (heads, keys, dim))
        out = carray(_floats(a[8]), (members, heads, dim))
        scratch = carray(_floats(a[9]), (members * heads, 2, keys))[piece]
        scale = kernels.float_bits(np.int32(a[7]))
        kernels.attend_head(q[m, h], kt[h], v[h], scale, scratch[0], out[m, h], scratch[1])


@kernels.compiled
def _conv_rows(a: Any, piece: Any) -> None:  # pragma: no cover - compiled
    """Piece ``piece`` of a convolution job (:func:`_post_conv`): its output rows ``r0:r1``, one
    SGEMM a tap adding into them, in tap order (the calls :func:`backends.piper.blas.conv_rows`
    makes without helpers)."""
    k, c_out, c_in, dilation, n, ldo = a[2], a[3], a[4], a[7], a[9], a[8]
    part = carray(_ints(a[10]), (a[11], 2))[piece]
    r0, r1 = part[0], part[1]
    out = a[6] + 4 * r0 * ldo
    for j in range(k):
        taps = a[1] + 4 * (j * c_out + r0) * c_in
        _sgemm(a[0], r1 - r0, n, c_in, taps, c_in, a[5] + 4 * dilation * j, a[12], out, ldo)


@kernels.compiled
def spin(yield_fn: Any, spins: Any) -> Any:  # pragma: no cover - compiled
    """One spin of a waiting thread (its ``spins`` so far): ``pause``, and every
    :data:`YIELD_EVERY` spins the C function at ``yield_fn`` (``sched_yield``:
    :data:`SCHED_YIELD`; 0: none). Returns the new count. For any compiled wait on another
    thread's progress (the board here, :mod:`backends.piper.coupling_tiles`' steps)."""
    _pause()
    spins += 1
    if spins % YIELD_EVERY == 0 and yield_fn != 0:
        _call(yield_fn)
    return spins


@kernels.compiled
def _work(board: Any, generation: Any) -> Any:  # pragma: no cover - compiled
    """Claims and runs pieces of the job ``generation`` until none is left (or the board holds
    another job: then every piece of this one was claimed); returns how many it ran. The
    claim word alone decides: its generation, its piece count and its next piece change
    together (a job's other slots are read only after a claim succeeds)."""
    word, done = _slot(board, WORD), _slot(board, DONE)
    ran = 0
    while True:
        claim = _load(word)
        if claim >> 32 != generation or claim & _PIECES >= (claim >> 16) & _PIECES:
            return ran
        if _swap(word, claim, claim + 1):
            _piece(board, claim & _PIECES)
            _add(done, 1)
            ran += 1


_BOARD = kernels.array_type(1, types.int64)


@kernels.kernel(types.void(_BOARD, types.int64, types.int64), slp=True)
def _serve(board: Any, idle: Any, index: Any) -> None:  # pragma: no cover - compiled
    """Helper ``index``'s loop: the pieces of every job published while it runs whose lanes
    include it, until ``idle`` cycles pass with no new job or the board's stop flag is set."""
    awake = _slot(board, AWAKE + index)
    _store(awake, 1)
    seen = -1
    last = _cycles()
    spins = 0
    while True:
        generation = _load(_slot(board, WORD)) >> 32
        if generation != seen:
            if index < board[LANES] - 1:  # read after the word: this job's lanes
                ran = _work(board, generation)
                if ran:
                    _add(_slot(board, TAKEN + index), ran)
            seen = generation
            last = _cycles()
        elif _load(_slot(board, STOP)) != 0 or _cycles() - last > idle:
            break
        else:
            spins = spin(board[YIELD], spins)
    _store(awake, 0)


@kernels.kernel(types.void(_BOARD), slp=True)
def _master(board: Any) -> None:  # pragma: no cover - compiled
    """Publishes the job written in the board's slots (:func:`_post_product`,
    :func:`_post_attention`), takes pieces of it like a helper, and returns when every piece
    is done. The claim word becomes (generation, count, 0) in one store: until then it says
    the last job's pieces are all claimed, so no helper reads the slots being written."""
    count = board[COUNT]
    _store(_slot(board, DONE), 0)
    generation = ((_load(_slot(board, WORD)) >> 32) + 1) & _GENERATIONS  # wraps, stays >= 0
    _store(_slot(board, WORD), (generation << 32) | (count << 16))
    _work(board, generation)
    done = _slot(board, DONE)
    spins = 0
    while _load(done) < count:
        spins = spin(board[YIELD], spins)


_IN1, _IN2 = kernels.array_type(1, readonly=True), kernels.array_type(2, readonly=True)
_I64 = types.int64
_IN3, _OUT2 = kernels.array_type(3, readonly=True), kernels.array_type(2)
_OUT1, _OUT3 = kernels.array_type(1), kernels.array_type(3)
_PARTS = kernels.array_type(2, types.int64, readonly=True)
_ADDRESSES = kernels.array_type(1, types.int64, readonly=True)


@kernels.kernel([types.void(_BOARD, _IN2, p, _IN1, _OUT2, _PARTS, _I64) for p in kernels.PANELS])
def _post_product(
    board: Any, x: Any, panels: Any, bias: Any, out: Any, parts: Any, lanes: Any
) -> None:  # pragma: no cover - compiled
    rows, depth = x.shape
    count, cols = panels.shape[0], out.shape[1]
    if (
        panels.shape[1] != depth
        or panels.shape[2] != kernels.PANEL
        or bias.shape[0] != count * kernels.PANEL
        or out.shape[0] != rows
        or cols > count * kernels.PANEL
        or cols <= (count - 1) * kernels.PANEL
        or parts.shape[1] != 4
        or parts.shape[0] > MAX_PIECES
    ):
        raise ValueError("product: x [M, K], panels [Q, K, 16], bias [Q * 16], out [M, n]")
    for i in range(parts.shape[0]):
        r0, r1, lo, hi = parts[i, 0], parts[i, 1], parts[i, 2], parts[i, 3]
        if not (0 <= r0 < r1 <= rows and 0 <= lo < hi <= count):
            raise ValueError("product: a part outside the rows or the panels")
    a = board[ARGS:]
    a[0], a[1], a[2] = _address(x), x.shape[0], x.shape[1]
    a[3], a[4], a[5] = _address(panels), panels.shape[0], _address(bias)
    a[6], a[7], a[8] = _address(out), out.shape[1], _address(parts)
    a[9] = 1 if panels.itemsize == 2 else 0  # halves' bits (the only 2-byte panels)
    board[KIND] = PRODUCT
    board[COUNT] = parts.shape[0]
    board[LANES] = lanes


_ATTENTION = (_BOARD, _IN2, _ADDRESSES, _ADDRESSES, _I64, _I64, _I64, _I64, _OUT2, _OUT3, _I64)


@kernels.kernel(types.void(*_ATTENTION))
def _post_attention(
    board: Any,
    q: Any,
    kts: Any,
    vs: Any,
    heads: Any,
    dim: Any,
    keys: Any,
    scale: Any,
    out: Any,
    scratch: Any,
    lanes: Any,
) -> None:  # pragma: no cover - compiled
    if q.shape[0] * heads > MAX_PIECES:
        raise ValueError("attention: more pieces than a job can have")
    if scratch.shape[0] != q.shape[0] * heads or scratch.shape[1] != 2 or scratch.shape[2] != keys:
        raise ValueError("attention: scratch [members * heads, 2, T]")
    a = board[ARGS:]
    a[0], a[1], a[2], a[3] = _address(q), q.shape[0], _address(kts), _address(vs)
    a[4], a[5], a[6], a[7], a[8] = heads, dim, keys, scale, _address(out)
    a[9] = _address(scratch)
    board[KIND] = ATTENTION
    board[COUNT] = q.shape[0] * heads
    board[LANES] = lanes


_CONV = (_BOARD, _IN3, _IN1, _I64, _I64, _I64, _OUT1, _I64, _I64, _PARTS, _I64, _I64)


@kernels.kernel(types.void(*_CONV))
def _post_conv(
    board: Any,
    taps: Any,
    src: Any,
    lds: Any,
    start: Any,
    dilation: Any,
    out: Any,
    ldo: Any,
    n: Any,
    parts: Any,
    lanes: Any,
    sgemm: Any,
) -> None:  # pragma: no cover - compiled
    k, c_out, c_in = taps.shape
    width = start + dilation * (k - 1) + n
    if start < 0 or dilation < 1 or n < 1 or k < 1 or c_in < 1 or sgemm == 0:
        raise ValueError("conv: start >= 0, dilation, columns, taps and channels >= 1")
    if not (kernels.rows_fit(src, lds, c_in, width) and kernels.rows_fit(out, ldo, c_out, n)):
        raise ValueError("conv: the rows with their strides must fit src and out")
    if (c_in > 1 and lds < width) or (c_out > 1 and ldo < n) or lds < n or ldo < n:
        raise ValueError("conv: a row stride shorter than its rows")
    if parts.shape[1] != 2 or parts.shape[0] > MAX_PIECES:
        raise ValueError("conv: parts [pieces, 2]")
    for i in range(parts.shape[0]):
        if not 0 <= parts[i, 0] < parts[i, 1] <= c_out:
            raise ValueError("conv: a part outside the output rows")
    a = board[ARGS:]
    a[0], a[1], a[2], a[3], a[4] = sgemm, _address(taps), k, c_out, c_in
    a[5], a[6], a[7], a[8] = _address(src) + 4 * start, _address(out), dilation, ldo
    a[9], a[10], a[11], a[12] = n, _address(parts), parts.shape[0], lds
    board[KIND] = CONV
    board[COUNT] = parts.shape[0]
    board[LANES] = lanes


class Helpers:
    """The helper threads and their board (one per process: :data:`HELPERS`)."""

    def __init__(self, idle_cycles: int = IDLE_CYCLES) -> None:
        self._board = np.zeros(BOARD_WORDS, np.int64)
        self._board[YIELD] = SCHED_YIELD
        self._idle = idle_cycles
        self._holder = threading.Lock()  # the caller whose job is on the board
        self._lock = threading.Lock()
        self._wakes: list[threading.Event] = []  # one a helper
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._wakeups = 0
        self._pinned: list[frozenset[int] | None] = []  # each helper's CPUs (None: its own)

    @property
    def awake(self) -> int:
        """Helpers spinning on the board now."""
        return int(self._board[AWAKE : AWAKE + MAX_HELPERS].sum())

    @property
    def taken(self) -> list[int]:
        """Pieces each helper has run (every job so far)."""
        return [int(n) for n in self._board[TAKEN : TAKEN + MAX_HELPERS]]

    @property
    def wakeups(self) -> int:
        """Times a helper began spinning (started, or woken after sleeping)."""
        return self._wakeups

    @property
    def started(self) -> int:
        """Helper threads started (each spinning or asleep)."""
        return len(self._threads)

    def product(
        self, x: np.ndarray, panels: np.ndarray, bias: np.ndarray, out: np.ndarray,
        parts: np.ndarray, lanes: int,
    ) -> bool:  # fmt: skip
        """:func:`backends.kernels.panel_rows` over ``parts`` (rows of (first row, end row, first
        panel, end panel), int64) on up to ``lanes`` cores; False (nothing done) when another
        caller holds the board. The caller checked the shapes (:func:`backends.panels.linear`)."""
        return self._run(
            lanes, lambda board: _post_product(board, x, panels, bias, out, parts, lanes)
        )

    def attention(
        self, q: np.ndarray, keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
        scale: float, out: np.ndarray, lanes: int,
    ) -> bool:  # fmt: skip
        """Member ``m``'s query row ``q[m]`` (``[heads * dim]``) over its window ``keys[m]``
        ``[heads, dim, T]`` and ``values[m]`` ``[heads, T, dim]`` into ``out[m]``, one piece a
        (member, head), as :func:`backends.kernels.query_attention`; False when another
        caller holds the board. Every window float32, C-contiguous, of the same shape."""
        heads, dim, length = keys[0].shape
        for kt, v in zip(keys, values, strict=True):
            if kt.shape != (heads, dim, length) or v.shape != (heads, length, dim):
                raise ValueError("attention: windows of different shapes")
            if not (_fits(kt) and _fits(v)):
                raise ValueError("attention: windows must be C-contiguous float32")
        if q.shape != (len(keys), heads * dim) or out.shape != q.shape or length == 0:
            raise ValueError("attention: q and out [members, heads * dim], windows not empty")
        kts = np.array([kt.ctypes.data for kt in keys], np.int64)
        vs = np.array([v.ctypes.data for v in values], np.int64)
        bits = int(np.float32(scale).view(np.int32))

        scratch = np.empty((len(keys) * heads, 2, length), np.float32)

        def post(board: np.ndarray) -> None:
            _post_attention(board, q, kts, vs, heads, dim, length, bits, out, scratch, lanes)

        return self._run(lanes, post)

    def conv(
        self, taps: np.ndarray, src: np.ndarray, lds: int, start: int, dilation: int,
        out: np.ndarray, ldo: int, n: int, parts: np.ndarray, lanes: int, sgemm: int,
    ) -> bool:  # fmt: skip
        """A convolution's output rows by ``parts`` (rows of (first row, end row), int64), each
        ``out[r] += sum_j taps[j, r] @ src[:, start + dilation j :][:, :n]`` for ``r`` in its
        rows by the ILP64 ``cblas_sgemm`` at ``sgemm``, on up to ``lanes`` cores; False (nothing
        done) when another caller holds the board. ``src`` and ``out`` are flat rows
        (:func:`backends.kernels.flat_rows`) ``lds`` and ``ldo`` apart, not overlapping each
        other or ``taps`` [K, C_out, C_in] (the caller checks that:
        :func:`backends.piper.blas.conv_rows`); the SGEMM must run on one thread (the caller
        holds the BLAS at one: :func:`backends.parallel.one_thread`)."""
        return self._run(
            lanes,
            lambda board: _post_conv(
                board, taps, src, lds, start, dilation, out, ldo, n, parts, lanes, sgemm
            ),
        )

    def _run(self, lanes: int, post: Callable[[np.ndarray], None]) -> bool:
        """Writes a job on the board with ``post`` and runs it with the helpers; False when
        another caller holds the board."""
        if not self._holder.acquire(blocking=False):
            return False
        try:
            helpers = self._start(min(lanes - 1, MAX_HELPERS))
            self._place(helpers)
            for index in range(helpers):  # this job's helpers that sleep: woken, not waited for
                if not self._board[AWAKE + index]:
                    self._wakes[index].set()
            post(self._board)  # checks and writes the job (or raises: nothing published)
            _master(self._board)
            return True
        finally:
            self._holder.release()

    def _place(self, helpers: int) -> None:
        """Moves this job's helpers onto the master's allowed CPUs other than its own where
        they were last put elsewhere (:mod:`backends.placement`: a helper woken after a long
        sleep may otherwise be put on the master's core and spin there while another core
        idles). A helper stays where it was put until a master runs on its CPUs or the
        allowed CPUs change, so this costs a system call only then."""
        others = placement.others(placement.current_cpu())
        if others is None:
            return
        with self._lock:  # close() may empty the lists meanwhile
            found = list(zip(self._threads[:helpers], self._pinned[:helpers], strict=True))
        for index, (thread, pinned) in enumerate(found):
            tid = thread.native_id
            if pinned != others and tid is not None and placement.move(tid, others):
                with self._lock:
                    if index < len(self._threads) and self._threads[index] is thread:
                        self._pinned[index] = others

    def _start(self, helpers: int) -> int:
        """Starts helpers up to ``helpers``; returns how many there are for this job."""
        with self._lock:
            while len(self._threads) < helpers and not self._closed:
                index = len(self._threads)
                self._wakes.append(threading.Event())
                thread = threading.Thread(
                    target=self._loop, args=(index,), name=f"voxpool-handoff-{index}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
                self._pinned.append(None)
            return min(helpers, len(self._threads))

    def _loop(self, index: int) -> None:
        wake = self._wakes[index]
        while True:
            wake.wait()
            if self._closed:
                return
            wake.clear()
            with self._lock:
                self._wakeups += 1
            _serve(self._board, self._idle, index)

    def close(self) -> None:
        """Stops the helpers and waits for them (a later job runs on its master alone)."""
        with self._lock:
            self._closed = True
            threads, self._threads, self._pinned = self._threads, [], []
        self._board[STOP] = 1
        for wake in self._wakes:
            wake.set()
        for thread in threads:
            thread.join()


ENABLED = _X86 and os.environ.get("VOXPOOL_HANDOFF", "1") != "0"
"""Whether splits go to the helpers: on x86-64 unless the environment sets
``VOXPOOL_HANDOFF=0`` (a host where a core spinning for a millisecond after a decoding
step is unwelcome: the splits then go to :mod:`backends.parallel`'s thread pool)."""


def usable(lanes: int) -> bool:
    """Whether a split for ``lanes`` cores goes to the helpers."""
    return ENABLED and lanes > 1


def _sched_yield() -> int:
    """The address of the C library's ``sched_yield`` (0 where it is not found): looked up in
    the process's own symbols, where the C library Python runs on (glibc, musl) has it."""
    try:
        return int(ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0)
    except (OSError, AttributeError):
        return 0


SCHED_YIELD = _sched_yield()
"""The address of the C library's ``sched_yield`` (0: not found), for compiled waits."""


def _fits(a: np.ndarray) -> bool:
    return a.dtype == np.float32 and bool(a.flags.c_contiguous)


HELPERS = Helpers()
"""The process's helpers."""
atexit.register(HELPERS.close)
