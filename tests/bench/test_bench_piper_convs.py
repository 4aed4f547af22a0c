"""Smoke test of bench/piper_convs.py (issue #15): one round over a short latent prints a row
for every conv it compares, both ways agreeing within float32 rounding. Timing figures are
not asserted (shared machine)."""

from __future__ import annotations

import pytest

from tests.bench.bench_module import bench_module

bench = bench_module("piper_convs")


def test_every_row_compares_two_ways_that_agree(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--rounds", "1", "--frames", "24"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| conv | new ms | before ms |")
    rows = [line.strip("|").split("|") for line in lines[2:]]
    labels = [row[0].strip() for row in rows]
    assert len(rows) == 8
    assert labels[0].startswith("flow in-layers x16") and labels[-1].startswith("HiFi-GAN")
    for row in rows:
        new_ms, old_ms, ratio, diff = (float(cell) for cell in row[1:])
        assert new_ms > 0 and old_ms > 0 and ratio > 0
        assert diff < 1e-4  # the same conv both ways
