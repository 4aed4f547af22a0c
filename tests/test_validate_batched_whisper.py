"""``voxpool validate --batching`` admits Whisper's batched engine at two batch slots: every
model check at the seed's minimum (3 starts, 10 waves), every output exact (one BLAS
thread: a member's tokens are the session's; docs/validation.md)."""

from __future__ import annotations

from tests.test_validate import batched_evidence


def test_whisper_batched_passes_every_model_check() -> None:
    for batched in batched_evidence("whisper", 2):
        assert batched["declared_tolerance"].startswith("exact")
        assert batched["outputs_within_tolerance_not_exact"] == 0
