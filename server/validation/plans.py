"""The validation procedure's constants; each family's plan (its fixed cases, reference
fingerprints and manifests of inputs) is its registry entry's ``plan``
(:class:`server.families.base.ValidationPlan`, :func:`plan`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.families import registry
from server.families.base import Case as Case
from server.families.base import ValidationPlan
from server.families.data import ROOT as ROOT
from server.families.data import sha256 as sha256

PROCEDURE = "model validation procedure, version 2026-10-04 (docs/validation.md)"
MIN_STARTS = 3  # the procedure's M2: at least three fresh starts per count
MIN_WAVES = 10  # the procedure's M3: ten mixed warm waves per start at the largest count
# M5, declared before any measurement: after the first half of a start's warm
# waves, RSS may still rise by at most this much; more is unexplained growth.
GROWTH_TOLERANCE_BYTES = 16 * 1024 * 1024
PACKAGES = (
    "numpy",
    "anyio",
    "attrs",
    "safetensors",
    "onnx",
    "tokenizers",
    "threadpoolctl",
)
"""The distributions every record lists the versions of, then each family's ``packages``."""
PASS, FAIL, PENDING, NOT_APPLICABLE = "PASS", "FAIL", "PENDING", "NOT_APPLICABLE"


def packages() -> tuple[str, ...]:
    """:data:`PACKAGES` and every registered family's own packages, once each."""
    own = (p for e in registry.entries() for p in e.packages)
    return tuple(dict.fromkeys((*PACKAGES, *own)))


def plan(family: str, load_options: Mapping[str, Any] | None = None) -> ValidationPlan:
    """The validation plan of ``family`` for a model with ``load_options`` (every plan takes
    them; one may declare its batched tolerance by them, e.g. silero_vad's ``batch_math``);
    ValueError when it has none."""
    entry = registry.family(family) if registry.is_family(family) else None
    if entry is None or entry.plan is None:
        known = sorted(registry.validated())
        raise ValueError(f"unknown family {family!r}; expected one of {known}")
    return entry.plan(**dict(load_options or {}))
