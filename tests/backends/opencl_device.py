"""Whether the OpenCL tests have a working device: skip with the probe's reason, or fail in CI.

A machine may list OpenCL devices that cannot build any kernel (the pip wheels'
PoCL on CPUs its LLVM does not know), so "a device exists" is not enough: the
tests need :func:`backends.opencl_backend.check_device` to find one that builds
and runs the probe kernel. Without one the OpenCL tests skip with the probe's
reason (devices tried, cause, fix), except under ``CI=true``, where a missing
working device is a failure: CI installs Debian's PoCL so that these tests run.

Use from a test module::

    cl = opencl_device.import_pyopencl()
    pytestmark = opencl_device.needs_working_device()
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import NoReturn

import pytest

from tests import ci


def skip_or_fail(reason: str, *, module_level: bool = False) -> NoReturn:
    """Skip with ``reason``, or fail with it under ``CI=true`` (:mod:`tests.ci`)."""
    ci.skip_or_fail(reason, needs="a working OpenCL device", module_level=module_level)


def import_pyopencl() -> ModuleType:
    """``pyopencl``, imported at module level; skips the module without it (fails in CI)."""
    try:
        import pyopencl
    except ImportError as exc:
        skip_or_fail(f"the opencl extra (pyopencl) is not installed: {exc}", module_level=True)
    return pyopencl


@functools.cache
def unavailable_reason() -> str | None:
    """Why the default device ("0") cannot be used, or ``None`` when it works (probed once)."""
    try:
        from backends.opencl_backend import OpenCLUnavailable, check_device
    except ImportError as exc:
        return f"the opencl extra (pyopencl) is not installed: {exc}"
    try:
        check_device("0")
    except OpenCLUnavailable as exc:
        return str(exc)
    return None


def needs_working_device() -> pytest.MarkDecorator:
    """Module level: skip the module with the probe's reason when no device works; under
    ``CI=true`` its tests run instead and each fails with that reason (the mark returned,
    for ``pytestmark``, requests the ``opencl_device`` fixture of tests/backends/conftest.py).
    """
    reason = unavailable_reason()
    if reason is not None and not ci.under_ci():
        pytest.skip(reason, allow_module_level=True)
    return pytest.mark.usefixtures("opencl_device")


def require() -> None:
    """Inside a test or fixture: skip (or, under ``CI=true``, fail) without a working device."""
    reason = unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)
