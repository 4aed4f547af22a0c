"""A Piper model pays its first request's one-time costs at load (issue #15, time to first audio).

Loading warms the phonemizer (piper's espeak-ng bridge: importing ``piper.voice``
and onnxruntime, the voice's espeak-ng data) and numpy.random up, about 50 ms the
first request's first audio paid before (docs/performance.md). Checked in a fresh
interpreter: after ``load_factory``, a first stream imports no module at all, and
its audio is the audio of a model that served a request before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import hashlib, json, sys
from threadpoolctl import threadpool_limits
from backends.piper import PiperRequest, load_factory

factory = load_factory(mode="streaming")
piper_voice = sys.modules.get("piper.voice")
warmed = piper_voice is not None and piper_voice._ESPEAK_PHONEMIZER is not None
before = set(sys.modules)
request = PiperRequest("Hello there. How are you?", seed=3)
with threadpool_limits(limits=1, user_api="blas"):
    first = [c.audio.tobytes() for c in factory.create().stream(request)]
    new = sorted(set(sys.modules) - before)
    again = [c.audio.tobytes() for c in factory.create().stream(request)]
print(json.dumps({"warmed": warmed, "new": new, "same": first == again, "chunks": len(first)}))
"""


def test_the_first_stream_after_a_load_imports_nothing_and_sounds_the_same() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["warmed"], "load_factory left espeak-ng for the first request to start"
    assert got["new"] == [], f"the first request imported {got['new']}"
    assert got["same"] and got["chunks"] == 2
