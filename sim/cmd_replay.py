"""``voxpool sim replay TRACE``: re-feed a recorded trace to a fresh core, compare every decision.

The trace is JSON lines as written by ``voxpool sim run --trace`` or a server
started with ``--trace``. Every core call in it is replayed in order
(:func:`core.replay.replay`); the first decision that differs is printed.
Exit status: 0 when every decision matches, 1 at the first divergence, 2 when
the file cannot be read or holds a record replay does not know.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.events import TraceRecord
from core.replay import replay


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Every record of a JSON-lines trace file (blank lines skipped)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(TraceRecord.from_json(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"line {number}: not a trace record ({exc})") from exc
    return records


def main(args: argparse.Namespace) -> int:
    try:
        records = read_trace(args.trace)
    except (OSError, ValueError) as exc:
        print(f"voxpool sim replay: cannot read {args.trace}: {exc}", file=sys.stderr)
        return 2
    try:
        result = replay(records)
    except Exception as exc:  # core refused a call outright: the trace is not from this core
        print(
            f"voxpool sim replay: core raised while replaying {args.trace}: {exc!r}",
            file=sys.stderr,
        )
        return 2
    if result.divergence is not None:
        print(f"first divergence after {result.replayed - 1} matching decisions:")
        print(f"  {result.divergence}")
        return 1
    print(f"all {result.replayed} decisions match")
    return 0
