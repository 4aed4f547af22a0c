"""``voxpool serve``: not built yet (the HTTP server is issue 5)."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    print(
        "voxpool serve: the HTTP server is not built yet; the core, runtime and simulator are "
        "(try `voxpool sim run scenarios/overdue_unload_waiting_1slot.toml`).",
        file=sys.stderr,
    )
    return 2
