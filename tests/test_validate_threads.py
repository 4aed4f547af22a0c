"""``voxpool validate`` pins its own BLAS threads, whatever earlier code of the process left.

The order ``tests/models/test_silero_vad*.py`` then ``tests/test_validate.py`` in one process
failed: a model test had loaded another library's OpenMP pool (ctranslate2's libgomp, at two
threads), which the manifest listed among the BLAS libraries. Here the gate runs after the
process was left as such tests leave it: the BLAS at two threads, the core share of an
adaptive runtime at two, and (where installed) ctranslate2's OpenMP loaded.
"""

from __future__ import annotations

import importlib.util

from threadpoolctl import threadpool_info, threadpool_limits

from backends import parallel
from server.validation.record import run_gate
from tests.test_validate import statuses


def test_the_gate_runs_at_one_blas_thread_after_a_process_left_two() -> None:
    if importlib.util.find_spec("ctranslate2") is not None:
        import ctranslate2  # noqa: F401  # its OpenMP pool, as the VAD-chunking tests load it
    with threadpool_limits(limits=2, user_api="blas"):
        parallel.SHARE.set_threads(2)  # what a runtime with adaptive threads leaves
        try:
            record = run_gate("silero_vad", 2, 1, 1, reproduction="test")
            after = parallel.SHARE.share()
        finally:
            parallel.SHARE.set_threads(None)
        blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    got = statuses(record)
    assert got["M1"] == got["M4"] == got["M6"] == "PASS"
    assert record["manifest"]["blas"] and all(
        b["num_threads"] == 1 for b in record["manifest"]["blas"]
    )
    assert after == 2 and blas == [2] * len(blas)  # the gate's pin ended with it
