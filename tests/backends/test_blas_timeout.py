"""OPENBLAS_THREAD_TIMEOUT reaches OpenBLAS whichever of numpy and voxpool is imported first.

Each case runs in a fresh interpreter (OpenBLAS reads its environment once per process)
and asks the loaded OpenBLAS what it took (``openblas_thread_timeout``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends import BLAS_THREAD_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
{first}
import numpy as np
from threadpoolctl import ThreadpoolController
libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
if not libs:
    print("no-openblas"); sys.exit(0)
lib = libs[0].dynlib
before = lib.openblas_thread_timeout()
a = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 512.0
product = a @ a  # a threaded product before voxpool is imported
import backends
after = lib.openblas_thread_timeout()
again = a @ a  # the threads started again with the new value
import time
cpu = time.process_time()
time.sleep(0.05)  # an idle OpenBLAS thread that still spins burns this CPU time
spun = time.process_time() - cpu
print(before, after, bool((product == again).all()), round(spun, 4))
"""


def _probe(first: str, environment: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env.update(environment, OPENBLAS_NUM_THREADS="2")
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    if out == ["no-openblas"]:
        pytest.fail("numpy's BLAS is not OpenBLAS here: the timeout cannot be checked")
    return out


TWO_CORES = (os.cpu_count() or 1) >= 2
"""An idle BLAS thread's spin shows as CPU time only where it has a core of its own."""


def test_numpy_imported_first_still_gets_the_timeout() -> None:
    before, after, same, spun = _probe("", {})
    assert before == "0"  # OpenBLAS loaded with numpy, before voxpool set anything
    assert after == BLAS_THREAD_TIMEOUT
    assert same == "True"
    # its threads run with the new value: idle after the product, not spinning for 0.1 s
    assert float(spun) < 0.02 or not TWO_CORES


def test_voxpool_imported_first_sets_it_before_numpy_loads() -> None:
    before, after, same, spun = _probe("import backends", {})
    assert before == after == BLAS_THREAD_TIMEOUT
    assert same == "True"
    assert float(spun) < 0.02 or not TWO_CORES


def test_a_users_own_setting_wins_in_either_order() -> None:
    for first in ("", "import backends"):
        before, after, _, _ = _probe(first, {"OPENBLAS_THREAD_TIMEOUT": "24"})
        assert before == after == "24"


def test_with_other_threads_running_openblas_keeps_what_it_read() -> None:
    """Restarting OpenBLAS's threads is safe only while no other thread can be in a BLAS
    call: an import with another thread alive leaves OpenBLAS as it is."""
    other = "import threading, time; threading.Thread(target=time.sleep, args=(3,)).start()"
    before, after, same, _ = _probe(other, {})
    assert before == after == "0" and same == "True"
