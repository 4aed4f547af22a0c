"""One op's independent pieces on several cores, each piece on one BLAS thread.

OpenBLAS spreads a product over its threads, but everything around the
products (numpy's ufuncs: ``exp``, GELU, the softmax's max and sum) runs on the
calling thread, and small products split badly: Whisper's encoder attention on
two BLAS threads took 54 ms a layer against 69 on one. Its six heads are
independent: three on each core, each with one BLAS thread, took 36.5 ms, the
same bits as one after another. :func:`run_pieces` does that for any op whose
pieces write disjoint outputs.

How many pieces run at once is the caller's **share** of the cores, the BLAS
thread count it would otherwise get: what the server's adaptive threads set
(``server.blas``: every core for a call alone, one each when the slots are full)
or, where nothing set it, the BLAS's own thread count (a script's
``threadpoolctl`` limit, say). While any split runs, the process's BLAS is held
at one thread (the setting is process-wide, so a split's pieces would otherwise
fight over the same BLAS threads: 66.7 ms instead of 36.5); a share set meanwhile
takes effect when the last split ends. A product of another call running then
gets one thread instead of its share: slower, never different (results do not
depend on the thread count beyond the tolerances ``server.blas`` declares).

Results never depend on the share: a piece computes exactly what it computes
when the pieces run one after another. A piece is one core's work: a split started
inside a piece (a batch's members on the cores, each member's convs split in tiles)
runs its items in order on that piece's thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, TypeVar

from backends import placement

T = TypeVar("T")


class _Blas:
    """The thread counts of every BLAS loaded in the process, through threadpoolctl."""

    def __init__(self, controllers: Sequence[Any]) -> None:
        self._controllers = list(controllers)

    @property
    def num_threads(self) -> int:
        return int(self._controllers[0].num_threads)

    def set_num_threads(self, n: int) -> None:
        """Sets every BLAS's count from whichever thread calls. threadpoolctl 3.8 lets only
        the first thread that set OpenBLAS's (pthreads) count set it again and silently
        ignores the others: in ``voxpool serve`` the main thread sets it at start-up
        (``cmd_serve.limit_blas_threads``), so a split in a session's worker thread left
        its pieces on two BLAS threads each (Whisper's encoder attention, 2 threads:
        172-218 ms a call from a worker thread against 35 from the main thread). The
        count is :data:`SHARE`'s to set, under its lock, so the library's own setter is
        called where threadpoolctl has one (``_real_set_num_threads``)."""
        for controller in self._controllers:
            setter = getattr(controller, "_real_set_num_threads", None)
            (setter if callable(setter) else controller.set_num_threads)(n)


def _blas_controller() -> _Blas | None:
    """Control of the BLAS numpy loaded (and any other), or None without one."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl comes with the server extra
        return None
    controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    return _Blas(controllers) if controllers else None


class CoreShare:
    """The BLAS thread count and the splits that borrow it (one per process: :data:`SHARE`).

    ``controller`` sets and reads the BLAS's threads (threadpoolctl's, looked up
    on first use; None: no control, every split the share decides runs its pieces in
    order, and one given ``lanes`` runs on that many threads, for pieces that do not call
    the BLAS); ``pool`` the worker threads (default: one a core, started on first use).
    """

    def __init__(
        self,
        controller: Any | None = None,
        *,
        look_up: bool = True,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._controller = controller
        self._looked_up = controller is not None or not look_up
        self._share: int | None = None  # set by set_threads; None: the BLAS's own count
        self._held: int | None = None  # the count to restore when the last split ends
        self._splits = 0
        self._pool = pool  # the workers (None: one a core, started on first use)
        self._piece = threading.local()  # .depth: pieces (and sequential blocks) on the thread

    def _control(self) -> Any | None:
        """The BLAS control, looked up once (under the lock: a second thread's first call
        waits for the first's lookup instead of seeing none)."""
        if not self._looked_up:
            with self._lock:
                if not self._looked_up:
                    self._controller = _blas_controller()
                    self._looked_up = True
        return self._controller

    def set_threads(self, n: int | None) -> None:
        """The share of the calls now running (the server's adaptive threads): the BLAS
        threads of a product and the pieces a split runs at once. Applied to the BLAS at
        once, or when the last split running ends. None: no share; splits follow the
        BLAS's own thread count again (left as it is)."""
        control = self._control()
        with self._lock:
            self._share = n
            if n is not None and self._splits == 0 and control is not None:
                control.set_num_threads(n)

    def share(self) -> int:
        """How many pieces a split started now would run at once (1 inside a piece)."""
        control = self._control()
        if control is None or self.in_piece():
            return 1
        with self._lock:
            if self._share is not None:
                return self._share
            if self._splits:
                return 1  # another split holds the BLAS at one thread: its count is not ours
            return max(1, int(control.num_threads))

    def in_piece(self) -> bool:
        """Whether the calling thread is running a piece of a split (of this share) or a
        :meth:`sequential` block."""
        return bool(getattr(self._piece, "depth", 0))

    def run(self, piece: Callable[[T], None], items: Sequence[T], lanes: int | None = None) -> None:
        """Calls ``piece(item)`` for every item, up to ``lanes`` at once (None: :meth:`share`;
        a caller passes the share it read before a :meth:`one_thread` block, which holds a
        script's share at one; inside a piece, one), each on one BLAS thread. The
        caller's thread and the workers take items one at a time from
        one queue, in order, so a worker that is late to start (its core held by another
        job) takes fewer items or none: when the queue is empty the caller withdraws the
        workers that have not started and waits only for pieces that are running. A
        failing piece stops every lane from taking more; its exception (the first
        recorded) is raised when no piece runs any longer. Pieces must write disjoint
        outputs (which thread computes an item never changes what it computes)."""
        workers = min(self.share() if lanes is None else lanes, len(items))
        if workers <= 1 or self.in_piece():
            for item in items:
                piece(item)
            return
        self._enter()
        try:
            pool = self._workers()
            queue = _Queue(self._as_piece(piece), items)
            with placement.keep_here() as elsewhere:  # the lanes go to the other cores
                futures = [pool.submit(queue.lane, elsewhere) for _ in range(workers - 1)]
                try:
                    queue.lane()
                finally:
                    for future in futures:
                        if not future.cancel():  # started: wait for its piece to end
                            future.exception()
            if queue.error is not None:
                raise queue.error
        finally:
            self._leave()

    def _as_piece(self, piece: Callable[[T], None]) -> Callable[[T], None]:
        """``piece``, marking its thread as in a piece while it runs (see :meth:`share`)."""
        local = self._piece

        def marked(item: T) -> None:
            local.depth = getattr(local, "depth", 0) + 1
            try:
                piece(item)
            finally:
                local.depth -= 1

        return marked

    @contextmanager
    def one_thread(self) -> Iterator[None]:
        """The block's products on one BLAS thread: the BLAS held at one thread as during a
        split (and restored as when a split ends), for code whose products are too small
        for OpenBLAS's threads. Each of those products waits for every BLAS thread, and a
        sleeping one on a core another process holds takes milliseconds to be scheduled:
        Piper's text encoder on a short sentence took 157 ms at two BLAS threads against
        36 at one with one other job running. A split inside the block still runs on the
        share the server set (a script's own BLAS count is held at one meanwhile: one
        piece at a time, unless the split is given the ``lanes`` its caller read before
        the block). Results are those of one BLAS thread, within the tolerances
        :mod:`server.blas` declares of any thread count."""
        if self._control() is None:
            yield
            return
        self._enter()
        try:
            yield
        finally:
            self._leave()

    @contextmanager
    def sequential(self) -> Iterator[None]:
        """The block as one piece of a split on the calling thread: a split inside it runs
        its items in order there (:meth:`share` is 1), for code whose pieces are too
        small to hand out (Piper's text encoder, a sentence's phonemes as columns: its
        convs cut in two tiles on two cores took 29.6 ms against 19.3 left whole on
        OpenBLAS's two threads, at 127 phonemes). The BLAS's thread count is left as it is
        (:meth:`one_thread` holds it at one)."""
        local = self._piece
        local.depth = getattr(local, "depth", 0) + 1
        try:
            yield
        finally:
            local.depth -= 1

    def _enter(self) -> None:
        control = self._control()
        with self._lock:
            self._splits += 1
            if self._splits == 1 and control is not None:
                self._held = int(control.num_threads) if self._share is None else self._share
                control.set_num_threads(1)

    def _leave(self) -> None:
        control = self._control()
        with self._lock:
            self._splits -= 1
            if self._splits == 0 and control is not None:
                restore = self._share if self._share is not None else self._held
                control.set_num_threads(restore or 1)

    def _workers(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
                self._pool = ThreadPoolExecutor(max(1, cores), thread_name_prefix="voxpool-split")
            return self._pool


class _Queue(Generic[T]):
    """The items of one split, handed out one at a time to its lanes (:meth:`CoreShare.run`)."""

    def __init__(self, piece: Callable[[T], None], items: Sequence[T]) -> None:
        self._piece = piece
        self._items = items
        self._next = 0
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def _take(self) -> int | None:
        with self._lock:
            if self.error is not None or self._next >= len(self._items):
                return None
            self._next += 1
            return self._next - 1

    def lane(self, cpus: frozenset[int] | None = None) -> None:
        """Runs pieces until the queue is empty or a piece failed (recorded in :attr:`error`);
        a worker's lane first moves onto ``cpus``, the CPUs other than the held caller's
        (:func:`backends.placement.move_to`)."""
        placement.move_to(cpus)
        while (i := self._take()) is not None:
            try:
                self._piece(self._items[i])
            except BaseException as error:  # raised by the caller once the split ended
                with self._lock:
                    if self.error is None:
                        self.error = error
                return


SHARE = CoreShare()
"""The process's core share: ``server.blas`` sets it, the numpy backend's splits use it."""


def run_pieces(piece: Callable[[T], None], items: Sequence[T], lanes: int | None = None) -> None:
    """:meth:`CoreShare.run` on the process's share."""
    SHARE.run(piece, items, lanes)


def sequential() -> AbstractContextManager[None]:
    """:meth:`CoreShare.sequential` on the process's share."""
    return SHARE.sequential()


def one_thread() -> AbstractContextManager[None]:
    """:meth:`CoreShare.one_thread` on the process's share."""
    return SHARE.one_thread()


def on_lanes(lane: Callable[[], None], tiles: int) -> None:
    """``lane()`` on each of up to ``tiles`` cores of the caller's share (one BLAS thread each;
    once, on the caller, with a share of one), for work that hands itself out: every call
    takes pieces from one shared queue or counter until none is left (Piper's tiles)."""
    n = max(1, min(SHARE.share(), tiles))
    if n == 1:
        lane()
        return
    run_pieces(lambda _: lane(), [None] * n)
