"""Every OpenCL op against the numpy reference (runs on PoCL's CPU device in CI)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.backends import opencl_device
from tests.backends.op_cases import (
    CASES,
    BadCase,
    Case,
    check_bad_case,
    check_case,
    covered_ops,
    interface_ops,
    missing_ops,
    over_bad_cases,
    over_cases,
)

cl = opencl_device.import_pyopencl()

from backends.opencl_backend import (  # noqa: E402
    OpenCLBackend,
    devices,
    make_backend,
    working_devices,
)

# no working device: skip with the probe's reason (devices, cause, fix); under CI=true, fail
pytestmark = opencl_device.needs_working_device()


@pytest.fixture(scope="module")
def backend() -> OpenCLBackend:
    return make_backend("0")


@over_cases
def test_op_matches_numpy(case: Case, backend: OpenCLBackend) -> None:
    check_case(case, backend)


@over_bad_cases
def test_bad_shapes_raise_the_shared_error(case: BadCase, backend: OpenCLBackend) -> None:
    """The same ShapeError as numpy and the array-module backends (test_xp_ops.py)."""
    check_bad_case(case, backend)


def test_every_interface_op_has_a_case() -> None:
    missing = interface_ops() - covered_ops()
    assert not missing, f"ops without a case: {sorted(missing)}"
    assert not missing_ops(OpenCLBackend)


def test_make_backend_device_strings() -> None:
    first = working_devices()[0]  # the default: the first device that builds kernels
    for spec in ("0", "", first.spec):
        be = make_backend(spec)
        assert be.name == "opencl"
        assert be.cl_device == first.device
        assert be.probe == first
    for bad in ("99", "7:7", "tpu", "-1"):
        with pytest.raises(ValueError, match="no device"):
            make_backend(bad)
    cpus = [r for r in working_devices() if r.is_cpu]
    if cpus:  # PoCL in CI: "cpu" (the ModelSpec default device) picks the first working one
        assert make_backend("cpu").cl_device == cpus[0].device
    for p, d, dev in devices():  # an explicit device that works is used as configured
        if any(r.device == dev for r in working_devices()):
            assert make_backend(f"{p}:{d}").cl_device == dev


def test_provider_builds_the_opencl_backend() -> None:
    from server.provider import make_backend as provider_make_backend

    be = provider_make_backend("opencl", "0")
    assert isinstance(be, OpenCLBackend)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(be.to_host(be.relu(be.to_device(x - 2))), np.maximum(x - 2, 0))


def test_forked_views_share_context_program_and_weights(backend: OpenCLBackend) -> None:
    w = backend.to_device(np.random.default_rng(1).standard_normal((24, 16)).astype(np.float32))
    views = [backend.fork() for _ in range(4)]
    assert all(v.context is backend.context and v.program is backend.program for v in views)
    assert len({id(v.queue) for v in [backend, *views]}) == 5
    assert len({id(v.kernels) for v in [backend, *views]}) == 5
    assert backend.kernels is backend.kernels  # built once per thread and view
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    expected = x @ backend.to_host(w).T
    for v in views:  # every view reads the one uploaded weight buffer
        got = v.to_host(v.linear(v.to_device(x), w))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_forked_queues_run_concurrently_from_threads(backend: OpenCLBackend) -> None:
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(3)
    w = backend.to_device(rng.standard_normal((64, 64)).astype(np.float32) / 8)
    inputs = [rng.standard_normal((5, 64)).astype(np.float32) for _ in range(8)]
    views = [backend.fork() for _ in inputs]

    def work(i: int) -> np.ndarray:
        v = views[i]
        y = v.to_device(inputs[i])
        for _ in range(10):
            y = v.tanh(v.linear(y, w))
        return v.to_host(y)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(len(inputs))))
    for i, got in enumerate(results):
        assert np.array_equal(got, work(i))  # same bits as the same session run alone


GPU_PATH_CASES = [
    c
    for c in CASES
    if c.name.startswith(
        (
            "matmul",
            "linear",
            "conv1d",
            "attention",
            "lstm",
            "sum",
            "max",
            "softmax",
            "log_softmax",
            "layer_norm",
        )
    )
]


@pytest.fixture(scope="module")
def tiled() -> OpenCLBackend:
    return OpenCLBackend("0", gemm="tiled")


@pytest.mark.parametrize("case", GPU_PATH_CASES, ids=lambda c: c.name)
def test_gpu_path_kernels_match_numpy(case: Case, tiled: OpenCLBackend) -> None:
    """The GPU defaults (local-memory tiled GEMM, work-group row reductions) on PoCL too."""
    assert tiled.gemm == "tiled"
    check_case(case, tiled)


def test_gemm_choice_follows_the_device_type(backend: OpenCLBackend) -> None:
    is_cpu = bool(backend.cl_device.type & cl.device_type.CPU)
    assert backend.gemm == ("cpu" if is_cpu else "tiled")
    assert backend.fork().gemm == backend.gemm
    with pytest.raises(ValueError, match="gemm"):
        OpenCLBackend("0", gemm="fast")


def test_one_view_shared_by_threads_is_safe(backend: OpenCLBackend) -> None:
    """Kernel objects are per thread, so sessions sharing the factory's backend may overlap."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(4)
    w = backend.to_device(rng.standard_normal((48, 48)).astype(np.float32) / 7)
    inputs = [rng.standard_normal((3, 48)).astype(np.float32) for _ in range(8)]

    def work(x: np.ndarray) -> np.ndarray:
        y = backend.to_device(x)
        for _ in range(10):
            y = backend.gelu(backend.linear(y, w))
        return backend.to_host(y)

    alone = [work(x) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(work, inputs))
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a, b)
