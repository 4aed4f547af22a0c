"""Array backends (numpy, opencl, cuda) and the model families that run on them.

Importing this package sets ``OPENBLAS_THREAD_TIMEOUT`` (unless the environment
already has it) before numpy loads OpenBLAS: an idle OpenBLAS thread otherwise
spins for 2**28 cycles (about 0.1 s) after each threaded product, holding the
core that the pieces of a split (:mod:`backends.parallel`) need: Whisper's
encoder at two threads took 554-576 ms with the spinning thread against 384-411
without it. Where numpy was imported first (a program that imports numpy before
voxpool), OpenBLAS has already read its environment and started its threads:
:func:`_reread_blas_timeout` then has it read the setting again and restart its
idle threads, which take the new timeout when the next threaded product starts
them (only while the program has one thread: see there).
"""

import os
import sys
import threading

BLAS_THREAD_TIMEOUT = "20"
"""OpenBLAS's spin before an idle thread sleeps, as a power of two of CPU cycles
(2**20: about 0.3 ms, longer than the gaps between the products of a decoding step)."""


def _reread_blas_timeout() -> None:
    """Has an OpenBLAS that numpy loaded already take ``OPENBLAS_THREAD_TIMEOUT`` from the
    environment as it is now. OpenBLAS reads the setting when it
    loads and gives it to its threads when it starts them, so this has it read its
    environment again (``openblas_read_env``: every ``OPENBLAS_*`` variable, of which only
    the timeout still matters once it runs) and, where the value changed, stops its idle
    threads (``blas_thread_shutdown_``, what OpenBLAS does itself around a fork); the next
    threaded product starts them again with the new value. Stopping them is safe only
    while no other thread is in a BLAS call, so it is done only while the program has one
    thread (an import from the main thread before any work, as in ``voxpool``'s commands
    and the benches); with other threads, a value that is not a number, or an OpenMP
    build (whose threads do not use the setting), OpenBLAS keeps what it read."""
    try:
        from threadpoolctl import ThreadpoolController

        wanted = int(os.environ["OPENBLAS_THREAD_TIMEOUT"])
    except (ImportError, ValueError):  # pragma: no cover - no threadpoolctl, or not a number
        return
    if threading.active_count() > 1:
        return
    for controller in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        lib = controller.dynlib
        names = ("openblas_thread_timeout", "openblas_read_env", "blas_thread_shutdown_")
        if controller.threading_layer != "pthreads" or not all(hasattr(lib, n) for n in names):
            continue  # pragma: no cover - an OpenMP build, or an OpenBLAS without them
        if lib.openblas_thread_timeout() != wanted:
            lib.openblas_read_env()
            lib.blas_thread_shutdown_()


os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT)
if "numpy" in sys.modules:
    _reread_blas_timeout()
