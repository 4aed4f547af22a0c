"""Core admission throughput: admission + release cycles per second.

    python bench/core.py [--seconds S]

Uncontended: one slot, one client, request then release. Contended: sixteen
slots, sixty-four requests kept queued, a manager every 32 cycles. Each figure
is the median of five runs; the ratio column compares each row with the
uncontended one (ratios travel between machines; absolute rates do not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.admission import Admission, Granted


def uncontended(cycles: int) -> float:
    adm = Admission("m", 1)
    now = 0.0
    start = time.perf_counter()
    for t in range(1, cycles + 1):
        now += 1e-6
        adm.request(t, now, 5.0)
        adm.release(t, now)
    return cycles / (time.perf_counter() - start)


def contended(cycles: int) -> float:
    """16 slots busy, 64 requests queued; each cycle releases one holder and admits one new
    request."""
    adm = Admission("m", 16)
    now = 0.0
    holders: list[int] = []
    ticket = 0

    def submit(manager: bool = False) -> None:
        nonlocal ticket
        ticket += 1
        d = adm.manage(ticket, now, None) if manager else adm.request(ticket, now, 5.0)
        if isinstance(d, Granted):
            holders.append(ticket)

    for _ in range(16 + 64):
        submit()
    start = time.perf_counter()
    for i in range(cycles):
        now += 1e-6
        released = adm.release(holders.pop(0), now)
        holders.extend(lease.ticket for lease in released.wakeups.granted)
        submit(manager=(i % 32 == 31))
    rate = cycles / (time.perf_counter() - start)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200_000)
    args = parser.parse_args()
    rows = []
    base = statistics.median(uncontended(args.cycles) for _ in range(5))
    rows.append(("uncontended (1 slot, 1 client)", base))
    cont = statistics.median(contended(args.cycles // 4) for _ in range(5))
    rows.append(("contended (16 slots, 64 queued, managers every 32)", cont))
    print(f"{'scenario':<55} {'cycles/s':>12} {'ratio':>7}")
    for name, rate in rows:
        print(f"{name:<55} {rate:>12,.0f} {rate / base:>7.2f}")


if __name__ == "__main__":
    main()
