"""``voxpool validate --batching`` admits Piper's batched engine at two batch slots: every
model check at the seed's minimum (3 starts, 10 waves), the audio within the engine's
declared tolerance (docs/validation.md). A file of its own, so that the test workers run it
beside Whisper's."""

from __future__ import annotations

from tests.test_validate import batched_evidence


def test_piper_batched_passes_every_model_check() -> None:
    for batched in batched_evidence("piper", 2):
        assert batched["declared_tolerance"].startswith("audio within 1e-4 per sample")
