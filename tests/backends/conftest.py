"""Fixtures shared by the backend tests."""

from __future__ import annotations

import pytest

from tests.backends import opencl_device as _opencl_device


@pytest.fixture(scope="session")
def opencl_device() -> None:
    """A working OpenCL device is required: skip with the probe's reason, fail under CI=true."""
    _opencl_device.require()
