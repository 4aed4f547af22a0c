"""Checks shared by the batched-engine tests of the model families."""

from __future__ import annotations

from typing import Any

import pytest

from core.engine import BatchEngine, BatchingFactory


def check_offers_an_engine(factory: Any, max_batch: int) -> None:
    """``factory`` is a BatchingFactory whose engines hold ``max_batch`` members (not 0)."""
    assert isinstance(factory, BatchingFactory)
    engine = factory.engine(max_batch)
    assert isinstance(engine, BatchEngine) and engine.max_batch == max_batch
    with pytest.raises(ValueError, match="max_batch"):
        factory.engine(0)
