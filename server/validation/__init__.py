"""Seed 003's model gate (M1-M6) as one automated run on the real runtime.

The gate drives :class:`server.runtime.Runtime` over the production
:class:`server.provider.ThreadedProvider` (wrapped by :class:`GateProvider` so
failures can be injected) and compares every output at the tested slot count
with the single-slot serial references, exactly, by the fingerprints of the family's
validation plan (its registry entry's ``plan``: audio bytes, token ids and text,
probabilities). Leases are
observed by polling ``runtime.status_of`` and host memory by sampling
``/proc/self/statm`` while the waves run. :func:`run_gate` returns the model
half of the admission record; :mod:`server.cmd_validate` adds the framework
half and writes it.
"""

from server.validation.plans import (
    FAIL,
    MIN_STARTS,
    MIN_WAVES,
    NOT_APPLICABLE,
    PASS,
    PENDING,
    PROCEDURE,
    ROOT,
)
from server.validation.probes import GateProvider
from server.validation.record import run_gate

__all__ = [
    "FAIL",
    "MIN_STARTS",
    "MIN_WAVES",
    "NOT_APPLICABLE",
    "PASS",
    "PENDING",
    "PROCEDURE",
    "ROOT",
    "GateProvider",
    "run_gate",
]
