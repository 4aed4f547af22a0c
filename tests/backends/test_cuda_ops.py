"""CUDA (cupy) backend: the same op comparisons as OpenCL, on a GPU when there is one.

Without cupy or a visible GPU the GPU tests skip with the reason; the array-module
logic of the backend (im2col, transposed conv, LSTM, attention, shapes) still runs
here on numpy through ``CudaBackend.on_host()``, which uses the same code without
the fused kernels (and through ``XpBackend(numpy)``, the generic class it inherits
from, in test_xp_ops.py). The fused kernels themselves are only checked on a GPU
(``bench/gpu_check.sh``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

from backends.cuda_backend import CudaBackend
from tests.backends.gpu import GPUS, needs_gpu
from tests.backends.op_cases import (
    BadCase,
    Case,
    check_bad_case,
    check_case,
    interface_ops,
    missing_ops,
    over_bad_cases,
    over_cases,
)


@pytest.fixture(scope="module")
def gpu_backend() -> CudaBackend:
    from backends.cuda_backend import make_backend

    return make_backend("0")


@needs_gpu
@over_cases
def test_gpu_op_matches_numpy(case: Case, gpu_backend: CudaBackend) -> None:
    check_case(case, gpu_backend)


@needs_gpu
@over_bad_cases
def test_gpu_bad_shapes_raise_the_shared_error(case: BadCase, gpu_backend: CudaBackend) -> None:
    check_bad_case(case, gpu_backend)


@needs_gpu
def test_gpu_forked_streams_share_weights(gpu_backend: CudaBackend) -> None:
    rng = np.random.default_rng(1)
    w = gpu_backend.to_device(rng.standard_normal((24, 16)).astype(np.float32))
    views = [gpu_backend.fork() for _ in range(4)]
    assert len({id(v.stream) for v in views}) == 4
    x = rng.standard_normal((3, 16)).astype(np.float32)
    expected = x @ gpu_backend.to_host(w).T
    for v in views:
        np.testing.assert_allclose(
            v.to_host(v.linear(v.to_device(x), w)), expected, rtol=1e-5, atol=1e-5
        )


@over_cases
def test_host_module_logic_matches_numpy(case: Case) -> None:
    check_case(case, CudaBackend.on_host())


def test_every_interface_op_is_implemented() -> None:
    assert not missing_ops(CudaBackend), f"CudaBackend lacks {sorted(missing_ops(CudaBackend))}"


def test_every_op_runs_in_the_views_device_and_stream() -> None:
    """Inherited XpBackend ops are scoped too (checked here, where the scope is a no-op)."""
    assert all(hasattr(getattr(CudaBackend, op), "__wrapped__") for op in interface_ops())
    be = CudaBackend.on_host()
    entered: list[str] = []

    @contextlib.contextmanager
    def stream() -> Iterator[None]:
        entered.append("stream")
        yield

    be._stream_ctx = stream  # type: ignore[method-assign]
    x = be.to_device(np.ones((2, 3), np.float32))
    entered.clear()
    be.add(x, x)  # inherited from XpBackend
    be.gelu(x)  # CudaBackend's own, falling back to XpBackend's
    assert entered == ["stream", "stream"]


def test_module_imports_without_cupy_and_fails_clearly_without_gpu() -> None:
    if GPUS:
        pytest.skip("a GPU is present: make_backend succeeds here")
    import importlib.util

    from backends.cuda_backend import make_backend

    if importlib.util.find_spec("cupy") is None:
        with pytest.raises(ImportError, match="cupy is not installed"):
            make_backend("0")
    else:  # cupy without a usable GPU: cupy's own CUDA error, or our device check
        with pytest.raises(Exception):  # noqa: B017
            make_backend("0")
