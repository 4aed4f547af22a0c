"""Array backends (numpy, opencl, cuda) and the model families that run on them.

Importing this package sets ``OPENBLAS_THREAD_TIMEOUT`` (unless the environment
already has it) before numpy loads OpenBLAS: an idle OpenBLAS thread otherwise
spins for 2**28 cycles (about 0.1 s) after each threaded product, holding the
core that the pieces of a split (:mod:`backends.parallel`) need: Whisper's
encoder at two threads took 554-576 ms with the spinning thread against 384-411
without it. It has no effect when numpy was imported first.
"""

import os

BLAS_THREAD_TIMEOUT = "20"
"""OpenBLAS's spin before an idle thread sleeps, as a power of two of CPU cycles
(2**20: about 0.3 ms, longer than the gaps between the products of a decoding step)."""

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT)
