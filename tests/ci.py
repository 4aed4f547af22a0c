"""One rule for checks that need something this machine may lack (a device, a browser, /proc).

Outside CI such a check skips with its reason, visible in ``pytest -ra``; under ``CI=true``
(where .ci/run installs what they need) it fails with that reason instead: CI never
passes by skipping.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """Whether ``CI=true``: then every check must run, never skip."""
    return os.environ.get("CI", "").strip().lower() == "true"


def skip_or_fail(reason: str, *, needs: str = "it", module_level: bool = False) -> NoReturn:
    """Skip with ``reason``, or, under ``CI=true``, fail saying CI requires ``needs``."""
    if under_ci():
        pytest.fail(f"CI=true requires {needs}: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)
