"""The curl examples of README.md's "Using the server" run as written (port substituted)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.server.live import ROOT, LiveServer, parse_sse

DOCUMENTED = "127.0.0.1:8080"


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Using the server\n", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        joined = block.replace("\\\n", " ")
        commands += [
            line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")
        ]
    return commands


def test_readme_curl_examples_run(main_server: LiveServer, tmp_path: Path) -> None:
    commands = readme_commands()
    assert len(commands) >= 7
    assert all(DOCUMENTED in c for c in commands)
    outputs: dict[str, str] = {}
    for command in commands:
        live = command.replace(DOCUMENTED, f"127.0.0.1:{main_server.port}")
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", live],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert '"error"' not in done.stdout, (command, done.stdout)
        path = re.search(r"127\.0\.0\.1:\d+(/[\w/.]*)", live)
        assert path is not None
        outputs[path.group(1) + (" stream" if '"stream": true' in live else "")] = done.stdout

    assert json.loads(outputs["/health"])["status"] == "ok"
    assert {m["id"] for m in json.loads(outputs["/v1/models"])["data"]} >= {
        "piper",
        "whisper",
        "silero_vad",
    }
    assert (tmp_path / "hello.wav").read_bytes()[:4] == b"RIFF"
    assert outputs["/v1/audio/transcriptions"].strip() == "Hello world."
    assert len(json.loads(outputs["/v1/audio/vad"])["segments"]) == 1
    events = parse_sse(outputs["/v1/audio/speech stream"])
    assert events[-1] == "[DONE]" and events[-2]["type"] == "speech.audio.done"
    assert outputs["/metrics"].startswith('voxpool_active_slots{model="')
