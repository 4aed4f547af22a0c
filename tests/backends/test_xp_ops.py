"""The array-module backend (backends/xp_backend.py) on numpy, and the shared shape rules.

``XpBackend(numpy)`` is the code the CUDA backend runs wherever it has no fused
kernel, so the op cases the CUDA tests use run here on every machine. The bad-shape
cases check that every backend (numpy, the generic class, the CUDA class on the
host; OpenCL in test_opencl_ops.py) raises the same ShapeError naming the op.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends import erf, shapes
from backends.base import OPS, ArrayBackend
from backends.cuda_backend import CudaBackend
from backends.numpy_backend import NumpyBackend
from backends.xp_backend import XpBackend
from tests.backends.op_cases import (
    BadCase,
    Case,
    check_bad_case,
    check_case,
    covered_ops,
    missing_ops,
    over_bad_cases,
    over_cases,
)

XP = XpBackend(np)


@over_cases
def test_generic_backend_on_numpy_matches_the_reference(case: Case) -> None:
    check_case(case, XP)


def test_the_numpy_and_cuda_backends_are_the_generic_one() -> None:
    assert issubclass(NumpyBackend, XpBackend) and issubclass(CudaBackend, XpBackend)
    assert not missing_ops(XpBackend), f"XpBackend lacks {sorted(missing_ops(XpBackend))}"
    assert covered_ops() >= OPS


BACKENDS: dict[str, ArrayBackend] = {
    "numpy": NumpyBackend(),
    "xp-numpy": XP,
    "cuda-on-host": CudaBackend.on_host(),
}


@pytest.mark.parametrize("backend", list(BACKENDS), ids=str)
@over_bad_cases
def test_bad_shapes_raise_the_shared_error(case: BadCase, backend: str) -> None:
    check_bad_case(case, BACKENDS[backend])


def test_shape_error_is_a_value_error() -> None:
    assert issubclass(shapes.ShapeError, ValueError)


@pytest.mark.parametrize(
    ("t", "k", "stride", "padding", "dilation"),
    [(50, 3, 1, 1, 1), (50, 3, 2, 2, 2), (33, 7, 3, 0, 1), (17, 1, 1, 0, 1), (9, 3, 4, 1, 2)],
)
def test_conv_lengths_are_the_output_lengths(
    t: int, k: int, stride: int, padding: int, dilation: int
) -> None:
    be = NumpyBackend()
    x = np.ones((1, 2, t), np.float32)
    y = be.conv1d(x, np.ones((3, 2, k), np.float32), None, stride, padding, dilation)
    assert y.shape[-1] == shapes.conv1d_length(t, k, stride, padding, dilation)
    for output_padding in range(min(stride, dilation)):
        yt = be.conv_transpose1d(
            x, np.ones((2, 3, k), np.float32), None, stride, padding, output_padding, dilation
        )
        expected = shapes.conv_transpose1d_length(t, k, stride, padding, output_padding, dilation)
        assert yt.shape[-1] == expected


def test_matmul_shape_follows_numpy() -> None:
    for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,))]:
        assert shapes.matmul_shape(sa, sb) == np.matmul(np.ones(sa), np.ones(sb)).shape
    assert shapes.matmul_shape((2, 1, 3, 4), (5, 4, 6)) == (2, 5, 3, 6)


def test_gelu_has_one_python_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy (chunked or not) and the generic class both evaluate erf.gelu: same bits."""
    import backends.numpy_backend as nb

    monkeypatch.setattr(nb, "_CHUNK", 50_000)  # several chunks, the last one partial
    x = np.random.default_rng(0).standard_normal((3, 70_000)).astype(np.float32) * 3
    expected = erf.gelu(np, x)
    assert np.array_equal(NumpyBackend().gelu(x), expected)
    assert np.array_equal(XP.gelu(x), expected)
    assert np.array_equal(NumpyBackend().gelu(x[:1, :100]), expected[:1, :100])
