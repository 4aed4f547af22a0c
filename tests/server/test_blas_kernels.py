"""An environment that forces OpenBLAS's 256-bit kernels on an AVX-512 CPU is reported at start-up.

This machine's environment was found setting ``OPENBLAS_CORETYPE=Haswell`` on a Zen 5:
Piper then took 1.35-1.43 times piper-tts's time instead of 0.87-0.96
(docs/performance.md, "Session 18"). voxpool keeps the setting (it is the operator's)
and says so when it serves.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.blas import AVX512, cpu_flags, kernels_note, loaded_kernels
from tests.server.live import DATA, LiveServer

ROOT = Path(__file__).resolve().parents[2]

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl

processor\t: 1
flags\t\t: fpu
"""


def test_the_first_processors_flags_are_read() -> None:
    flags = cpu_flags(CPUINFO)
    assert flags >= AVX512 and "fpu" in flags and "avx2" in flags
    assert cpu_flags("processor\t: 0\n") == frozenset()


@pytest.mark.parametrize("architecture", ["Haswell", "Zen", "SandyBridge", "Excavator", "Atom"])
def test_narrow_kernels_forced_on_an_avx512_cpu_are_reported(architecture: str) -> None:
    note = kernels_note(architecture, cpu_flags(CPUINFO), "Haswell")
    assert note is not None
    assert "OPENBLAS_CORETYPE=Haswell" in note and f"its {architecture} kernels" in note


@pytest.mark.parametrize(
    ("architecture", "flags", "coretype"),
    [
        ("Haswell", frozenset(AVX512), None),  # OpenBLAS's own choice: not the operator's
        ("Haswell", frozenset(AVX512), ""),  # set but empty: OpenBLAS chose
        ("SkylakeX", frozenset(AVX512), "SkylakeX"),  # AVX-512 kernels
        ("Cooperlake", frozenset(AVX512), "Cooperlake"),
        ("Haswell", frozenset({"avx2", "avx512f"}), "Haswell"),  # no full AVX-512 set
        (None, frozenset(AVX512), "Haswell"),  # no OpenBLAS loaded
    ],
)
def test_nothing_is_said_otherwise(
    architecture: str | None, flags: frozenset[str], coretype: str | None
) -> None:
    assert kernels_note(architecture, flags, coretype) is None


@pytest.mark.parametrize("coretype", ["Haswell", None])
def test_serve_says_so_at_start_up(
    coretype: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real server, with and without a forced kernel set: the warning appears exactly
    where this machine's CPU has AVX-512 and the set numpy's BLAS loads under that
    environment (asked of a fresh interpreter: MKL, or an OpenBLAS without its runtime
    choice, loads none of OpenBLAS's sets) is narrower."""
    if coretype is None:
        monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_CORETYPE", coretype)
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = cpu_flags(f.read())
    probe = "import numpy; from server.blas import loaded_kernels; print(loaded_kernels())"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    expected = kernels_note(None if loaded == "None" else loaded, flags, coretype) is not None
    server = LiveServer(DATA / "lazy_vad.json", tmp_path).start()
    try:
        server.stop()
        warned = "OPENBLAS_CORETYPE=Haswell has numpy's OpenBLAS run" in server.log()
    finally:
        server.stop()
    assert warned == expected, server.log()
    if coretype is not None and loaded.lower() == "haswell":
        assert warned == (flags >= AVX512)  # this machine's case, spelled out


def test_the_loaded_kernels_are_named() -> None:
    import numpy  # noqa: F401  (loads OpenBLAS)
    from threadpoolctl import threadpool_info

    if not any(i.get("internal_api") == "openblas" for i in threadpool_info()):
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    assert loaded_kernels()  # numpy's wheels ship OpenBLAS: its kernel set has a name
