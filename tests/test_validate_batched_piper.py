"""``voxpool validate --batching`` admits Piper's batched engine at two batch slots: every
model check at the seed's minimum (3 starts, 10 waves), the audio within the engine's
declared tolerance (docs/validation.md)."""

from __future__ import annotations

from server.cmd_validate import build_record
from server.validation import MIN_STARTS, MIN_WAVES
from tests.test_validate import check_batched_record


def test_piper_batched_passes_every_model_check() -> None:
    record = build_record(
        "piper", 2, MIN_STARTS, MIN_WAVES, framework=False, reproduction="test", batching=True
    )
    rows = check_batched_record(record, 2)
    for cid in ("M2", "M3", "M4", "M6"):
        batched = rows[cid]["evidence"]["batched"]
        assert batched["declared_tolerance"].startswith("audio within 1e-4 per sample")
