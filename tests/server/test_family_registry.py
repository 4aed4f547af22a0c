"""The family registry: a new family is one backend package plus one registry entry.

A tiny family (tests/server/energy_vad: a backend package whose module also holds its
one entry and HTTP adapter) is registered, and the configuration, the provider, the
HTTP routes, the OpenAPI document and model management accept it with no other module
changed. A guard reads server/ and bench/ and fails when a module names a bundled
family outside its own entry and adapter (or, in bench/, a bench of its backend).
"""

from __future__ import annotations

import ast
import base64
import io
import json
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

from server.config import ConfigError, embedded_default, parse_config
from server.families import registry
from server.families.base import Family
from server.http.app import build_app
from server.provider import ThreadedProvider
from server.serving import make_state
from tests.server import energy_vad

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "registry-test-token"


@pytest.fixture()
def energy() -> Iterator[Family]:
    registry.register(energy_vad.ENTRY)
    try:
        yield energy_vad.ENTRY
    finally:
        registry.unregister(energy_vad.NAME)


def tone_wav() -> bytes:
    """Half a second of silence, then half a second of a 440 Hz tone; 16 kHz mono 16-bit."""
    t = np.arange(8000) / 16000
    audio = np.concatenate([np.zeros(8000), 0.5 * np.sin(2 * np.pi * 440 * t)])
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((audio * 32767).astype("<i2").tobytes())
    return out.getvalue()


def config(**extra: object) -> dict[str, object]:
    model = {"id": "energy", "family": "energy_vad", "load_options": {"frame_ms": "10"}}
    return {"models": [model], **extra}


def test_config_parses_a_registered_family(energy: Family) -> None:
    (model,) = parse_config(config()).models
    assert (model.family, model.task, dict(model.load_options)) == (
        "energy_vad",
        "vad",
        {"frame_ms": "10"},
    )
    bad_option = config()
    bad_option["models"] = [{"id": "e", "family": "energy_vad", "load_options": {"x": 1}}]
    with pytest.raises(ConfigError, match=r"unknown load_options key 'x'.*known: frame_ms"):
        parse_config(bad_option)
    wrong_task = {"models": [{"id": "e", "family": "energy_vad", "task": "asr"}]}
    with pytest.raises(ConfigError, match="family energy_vad serves task 'vad', not 'asr'"):
        parse_config(wrong_task)
    with pytest.raises(ConfigError, match=r"unknown family 'nope' \(.*energy_vad\)"):
        parse_config({"models": [{"id": "e", "family": "nope"}]})
    assert "energy" not in [m.id for m in embedded_default().models]  # no embedded model


def test_an_unregistered_family_is_unknown_again() -> None:
    with pytest.raises(ConfigError, match="unknown family 'energy_vad'"):
        parse_config(config())


def test_the_provider_loads_it_through_its_entry(energy: Family) -> None:
    (model,) = parse_config(
        {"models": [{"id": "e", "family": "energy_vad", "mode": "streaming"}]}
    ).models

    async def load() -> tuple[str, str, int]:
        provider = ThreadedProvider()
        factory = await provider.load(model.spec())
        try:
            return factory.family, factory.mode, factory.frame  # type: ignore[attr-defined]
        finally:
            await provider.release(model.spec(), factory)

    # the spec's mode reaches load_factory (mode_option); frame_ms defaults to 20 ms
    assert anyio.run(load) == ("energy_vad", "streaming", 320)


async def serve_energy() -> None:
    """The routes a VAD family serves, the model listing, management and the OpenAPI document."""
    wav = tone_wav()
    speech = [{"start_sample": 8000, "end_sample": 16000}]
    state = make_state(parse_config(config(ui_management=True, management_token=TOKEN)))
    transport = httpx.ASGITransport(app=build_app(state))
    async with state.runtime, httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        files = {"file": ("t.wav", wav)}
        r = await c.post("/v1/audio/vad", data={"model": "energy"}, files=files)
        assert r.status_code == 200, r.text
        assert r.json()["segments"] == speech
        assert r.json()["timing"]["audio_duration_ms"] == 1000.0
        body = {"model": "energy", "request": {"audio_base64": base64.b64encode(wav).decode()}}
        r = await c.post("/v1/tasks/run", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["segments"] == speech
        r = await c.post("/v1/tasks/stream", json=body)
        assert r.status_code == 200, r.text
        assert len(r.json()["events"]) == 100  # one per 10 ms frame
        r = await c.post("/v1/tasks/run", json={**body, "request": {"threshold": 2}})
        assert r.status_code == 400 and "'threshold'" in r.text  # the adapter's own check
        rows = {row["id"]: row for row in (await c.get("/v1/models")).json()["data"]}
        assert (rows["energy"]["family"], rows["energy"]["task"]) == ("energy_vad", "vad")
        load = await c.post(
            "/v1/models/load",
            json={"id": "energy2", "family": "energy_vad", "load_options": {"frame_ms": "20"}},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert load.status_code == 200, load.text
        schema = (await c.get("/openapi.json")).json()
        assert '"energy_vad"' in json.dumps(schema["paths"]["/v1/models/load"])


def test_the_http_routes_serve_it(energy: Family) -> None:
    anyio.run(serve_energy)


# --------------------------------------------------------------- the guard
def own_modules(entry: Family) -> set[Path]:
    """The server modules that may name ``entry``'s family: its entry and its adapter."""
    families = ROOT / "server" / "families"
    return {families / f"{entry.name}.py", families / f"{entry.name}_http.py"}


def backends_imported(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """The families of ``names`` whose backend package ``tree`` imports, with the line."""
    found = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "backends":
            modules = [f"backends.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "backends" and len(parts) > 1 and parts[1] in names:
                found.append((node.lineno, parts[1]))
    return found


def namings(path: Path, names: set[str], measured: bool = False) -> list[str]:
    """Where ``path`` names a family of ``names`` (``line: what``): a string equal to one, or an
    import of one's backend package. With ``measured`` (a bench), a module that imports a
    family's backend measures it directly and may name that family."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = backends_imported(tree, names)
    own = {name for _, name in imported} if measured else set()
    found = [f"{line}: import backends.{name}" for line, name in imported if name not in own]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names - own:
            found.append(f"{node.lineno}: {node.value!r}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_only_a_familys_own_modules_name_it() -> None:
    """Consumers read the registry: no module of server/ names a bundled family (a string equal
    to its name, an import of its backend package) except the family's own entry and adapter,
    and no bench names one except a bench that measures that family's backend directly."""
    allowed = {ROOT / "server" / "families" / "registry.py"}
    for entry in registry.ENTRIES:
        allowed |= own_modules(entry)
        assert (ROOT / "server" / "families" / f"{entry.name}.py").is_file()
    names = {entry.name for entry in registry.ENTRIES}
    server = [p for p in sorted((ROOT / "server").rglob("*.py")) if p not in allowed]
    offences = [f"{p.relative_to(ROOT)}:{hit}" for p in server for hit in namings(p, names)]
    for path in sorted((ROOT / "bench").glob("*.py")):
        offences += [f"{path.relative_to(ROOT)}:{hit}" for hit in namings(path, names, True)]
    assert offences == []


def test_the_guard_sees_a_named_family(tmp_path: Path) -> None:
    module = tmp_path / "consumer.py"
    module.write_text(
        'import backends.piper\nFAMILY = "piper"\nOTHER = "piper-tts"\n"""About piper."""\n'
        "from backends import whisper\n"
    )
    names = {"piper", "whisper"}
    assert namings(module, names) == [
        "1: import backends.piper",
        "2: 'piper'",
        "5: import backends.whisper",
    ]
    generic = tmp_path / "generic_bench.py"
    generic.write_text('MODEL = "piper"\n')
    assert namings(module, names, measured=True) == []  # it measures piper and whisper
    assert namings(generic, names, measured=True) == ["1: 'piper'"]


# --------------------------------------------------------------- the bundled entries
@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda e: e.name)
def test_each_bundled_entry_is_complete(entry: Family) -> None:
    adapter = entry.adapter()
    assert adapter.task == entry.task
    common = ("check", "voices", "json", "chunk_json", "duration")
    extra = ("aliases", "request", "audio") if entry.task == "tts" else ("request", "check_fields")
    assert all(callable(getattr(adapter, name)) for name in (*common, *extra))
    assert entry.plan is not None and entry.weights is not None
    assert entry.run_request is not None and entry.workload is not None
    assert set(entry.modes) <= {"offline", "streaming"}
    assert bool(entry.voices) == (entry.task == "tts")
    assert entry.path_option is None or entry.path_option in entry.load_options


def test_the_embedded_default_batches_vad_on_the_parallel_runtime_only() -> None:
    """Live VAD works out of the box with --parallel-jobs; the original runtime (one session
    per model, no slots) gets no parallel-only key."""
    from core.policy import RuntimeKind

    vad = {m.id: m for m in embedded_default().models}["silero_vad"]
    assert vad.batching and vad.slots == 32
    original = embedded_default(RuntimeKind.ORIGINAL).models
    assert all(not m.batching and m.slots == 1 for m in original)


def test_a_path_is_refused_where_it_cannot_be_used(tmp_path: Path) -> None:
    """A family that runs its bundled weights takes no path (refused, not ignored); a
    Whisper directory must hold a model's files, so that a model that cannot load is a
    configuration error, not a registered model whose every request fails."""
    for family in ("piper", "silero_vad"):
        with pytest.raises(ConfigError, match=f"family {family} takes no path"):
            parse_config({"models": [{"id": "m", "family": family, "path": "/etc/passwd"}]})
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is not a whisper model: it has no tokenizer\.json"):
        parse_config({"models": [{"id": "w", "family": "whisper", "path": str(tmp_path)}]})
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"it has no model\.bin, tokenizer\.json"):
        parse_config(
            {
                "models": [
                    {"id": "w", "family": "whisper", "load_options": {"model_dir": str(empty)}}
                ]
            }
        )
    (tmp_path / "tokenizer.json").write_text("{}")
    (model,) = parse_config(
        {"models": [{"id": "w", "family": "whisper", "path": str(tmp_path)}]}
    ).models
    assert model.path == str(tmp_path)


def test_model_keys_are_what_parse_model_reads() -> None:
    """``MODEL_KEYS`` (what a management load may give) is the one list of a ``models[]``
    entry's keys: exactly those ``parse_model`` reads."""
    from core.policy import RuntimeKind
    from server.config import MODEL_KEYS, parse_model

    read: set[str] = set()

    class Entry(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            read.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> Any:
            read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            read.add(str(key))
            return super().__contains__(key)

    parse_model(Entry(id="t", family="piper"), {}, RuntimeKind.PARALLEL, None)
    assert read == set(MODEL_KEYS)
    assert len(MODEL_KEYS) == len(set(MODEL_KEYS))
