"""``voxpool run tts|asr|vad`` end to end, as a user would type them."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from server.codecs import sniff

ROOT = Path(__file__).resolve().parent.parent


def voxpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_tts_then_vad_then_asr_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    tts = voxpool("run", "tts", "--text", "Good morning. The weather is fine.", "-o", str(out))
    assert tts.returncode == 0, tts.stderr
    assert "sentence 2" in tts.stderr, "progress is reported per sentence"
    with wave.open(str(out)) as w:
        assert w.getframerate() == 22050 and w.getnchannels() == 1
        assert 1.0 < w.getnframes() / 22050 < 6.0
    vad = voxpool("run", "vad", str(out), "-o", str(tmp_path / "vad.json"))
    assert vad.returncode == 0, vad.stderr
    assert vad.stdout.startswith("speech "), vad.stdout
    segments = json.loads((tmp_path / "vad.json").read_text())["segments"]
    assert len(segments) == vad.stdout.count("speech "), "-o holds what was printed, as JSON"
    assert f"speech {segments[0]['start']:8.3f}" in vad.stdout
    asr = voxpool("run", "asr", str(out), "-o", str(tmp_path / "asr.json"))
    assert asr.returncode == 0, asr.stderr
    words = asr.stdout.lower()
    assert "morning" in words and "weather" in words, asr.stdout
    answer = json.loads((tmp_path / "asr.json").read_text())
    assert answer["text"].strip() == asr.stdout.strip() and answer["segments"][0]["id"] == 0
    assert answer["language"] == "en" and answer["duration"] > 1.0  # the server's JSON


def test_tts_encodes_the_format_its_suffix_names(tmp_path: Path) -> None:
    out = tmp_path / "hello.mp3"
    tts = voxpool("run", "tts", "--text", "Hello.", "--seed", "7", "-o", str(out))
    assert tts.returncode == 0, tts.stderr
    assert sniff(out.read_bytes()) == "mp3", out.read_bytes()[:16]
    assert "of mp3" in tts.stderr


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    """A user's mistake: exit 2 and a last stderr line naming it, no traceback, nothing out."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("tts", "--text", "Hi.", "-o", "/nonexistent/x.wav"), ("-o", "no directory")),
        (("vad", "in.wav", "-o", "/nonexistent/v.json"), ("-o", "no directory")),
        (("tts", "--text", "Hi.", "-o", "."), ("-o", "is a directory")),
        (("tts", "--text", "Hi.", "--seed", "9" * 23, "-o", "s.wav"), ("--seed", "0..")),
        (("tts", "--text", "Hi.", "--seed", "-1", "-o", "s.wav"), ("--seed", "0..")),
        (("tts", "--text", "Hi.", "-o", "x.gif"), ("x.gif", ".wav", ".mp3")),
    ],
)
def test_bad_arguments_are_one_line_errors_before_any_work(
    tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    result = voxpool("run", *[str(tmp_path / a) if a in ("x.gif", "s.wav") else a for a in args])
    one_line_error(result, *words)
    assert not list(tmp_path.iterdir()), "nothing was written"


def test_clear_errors_for_bad_input(tmp_path: Path) -> None:
    missing = voxpool("run", "asr", str(tmp_path / "nope.wav"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"not a wav file at all")
    bad = voxpool("run", "vad", str(garbage))
    assert bad.returncode == 2 and "not a WAV file" in bad.stderr
    no_text = voxpool("run", "tts", "-o", str(tmp_path / "x.wav"))
    assert no_text.returncode == 2 and "--text is required" in no_text.stderr
