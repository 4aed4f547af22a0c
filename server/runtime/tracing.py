"""The trace sink: numbers records in order and keeps them, or writes JSON lines."""

from __future__ import annotations

from typing import IO

import attrs

from core.events import TraceRecord


class TraceLog:
    """Collects trace records (and optionally writes each as one JSON line to ``out``).

    The log owns the sequence numbers, so records from core and from the
    driver (client actions) interleave in one order.
    """

    def __init__(self, out: IO[str] | None = None, keep: bool = True) -> None:
        self.records: list[TraceRecord] = []
        self._out = out
        self._keep = keep
        self._seq = 0

    def __call__(self, record: TraceRecord) -> None:
        self._seq += 1
        record = attrs.evolve(record, seq=self._seq)
        if self._keep:
            self.records.append(record)
        if self._out is not None:
            self._out.write(record.to_json() + "\n")
            self._out.flush()

    def lines(self) -> list[str]:
        return [r.to_json() for r in self.records]
