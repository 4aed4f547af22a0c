"""How long an abandoned request keeps its slot: a real ``voxpool serve``, clients that give up.

Starts the embedded default (bundled models, numpy, 2 slots each) from ``--root``
(default: this checkout; give another checkout to measure it with this bench) on a
free loopback port. For each task, ``--rounds`` times: waits until the model has no
active slot, sends one long request whose client gives up after ``--patience``
seconds (a read timeout: the connection is closed), then polls ``/v1/models`` until
the model's active slots are back at 0. Prints, per round, when the client left and
how long after that the slot was free. The requests:

* asr: ``tests/data/whisper/story.wav`` (55 s) to ``/v1/audio/transcriptions``
  (a session runs the whole file as one call);
* tts: 60 sentences to ``/v1/audio/speech`` (one call, sentence after sentence).

    .venv/bin/python bench/abandoned.py [--root DIR] [--rounds 3] [--patience 1.5]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
STORY = ROOT / "tests/data/whisper/story.wav"
TEXT = " ".join(["This is one sentence of a long text that nobody will hear."] * 60)
POLL_S = 0.02
"""How often the slots are read (the figures' resolution)."""
START_GUARD_S = 300.0
"""The longest the server may take to start (a first start compiles the kernels)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def active(client: httpx.Client, model: str) -> int:
    rows = client.get("/v1/models").json()["data"]
    return int(next(r["active_slots"] for r in rows if r["id"] == model) or 0)


def task_model(client: httpx.Client, task: str) -> str:
    """The id of the first model the server lists for ``task``."""
    rows = client.get("/v1/models").json()["data"]
    return str(next(r["id"] for r in rows if r["task"] == task))


def give_up(client: httpx.Client, task: str, model: str, patience: float) -> None:
    """One long request whose client leaves after ``patience`` seconds without an answer."""
    timeout = httpx.Timeout(30.0, read=patience)
    try:
        if task == "asr":
            files = {"file": ("story.wav", STORY.read_bytes(), "audio/wav")}
            client.post(
                "/v1/audio/transcriptions", files=files, data={"model": model}, timeout=timeout
            )
        else:
            client.post("/v1/audio/speech", json={"model": model, "input": TEXT}, timeout=timeout)
    except httpx.TimeoutException:
        return
    raise SystemExit(f"{task}: the request ended before its client gave up (raise --patience)")


def wait_started(client: httpx.Client, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--patience", type=float, default=1.5)
    parser.add_argument("--tasks", default="asr,tts")
    args = parser.parse_args()
    port = free_port()
    command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        command, cwd=args.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    print(f"root {args.root}, patience {args.patience} s")
    print("| task | round | client left after (s) | slot free after that (s) |")
    print("|---|---:|---:|---:|")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            wait_started(client, proc)
            for task in args.tasks.split(","):
                model = task_model(client, task)
                for i in range(args.rounds):
                    while active(client, model):
                        time.sleep(POLL_S)
                    t0 = time.perf_counter()
                    give_up(client, task, model, args.patience)
                    left = time.perf_counter()
                    while active(client, model):
                        time.sleep(POLL_S)
                    free = time.perf_counter() - left
                    print(f"| {task} | {i + 1} | {left - t0:.2f} | {free:.2f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
