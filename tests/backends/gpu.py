"""Whether a CUDA GPU usable by cupy is present, for the CUDA tests' skip marker."""

from __future__ import annotations

import importlib.util

import pytest


def gpu_count() -> int:
    """Visible CUDA devices; 0 without cupy or without a driver/device."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver / no device: cupy raises its own CUDA errors
        return 0


GPUS = gpu_count()
needs_gpu = pytest.mark.skipif(
    GPUS == 0,
    reason="needs cupy and a CUDA GPU (none here); run bench/gpu_check.sh on a GPU machine",
)
