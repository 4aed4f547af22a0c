"""The server configuration: audio.cpp's ``server.json`` format (reference §2).

Parsing is strict: duplicate JSON keys, unknown keys, model ids a URL cannot name,
unknown families or backends, negative durations, bad slot counts and a model over the
whole memory budget are rejected with a message naming the key.
Families, their tasks, modes and ``load_options`` come from the family registry
(:mod:`server.families.registry`); backends are ``numpy`` (alias ``cpu``), ``opencl``
and ``cuda``. With no file, :func:`embedded_default` describes the bundled models
(each registered family's ``embedded`` model) on numpy.

Differences from audio.cpp (docs/differences.md): the default backend is
``numpy``; the default body limit is 64 MiB (audio.cpp: 2 GiB); ``audio_roots``
(directories server-local audio paths may be read from; none by default),
``management_token``, ``max_queue``, ``memory_budget_mb`` (with per-model ``memory_mb``) and a TTS
model's ``voice_aliases`` (OpenAI's voice names by default, :data:`OPENAI_VOICES`) are ours; the web
UI keys (``ui``, ``voice_dir``...) are accepted and ignored.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import attrs

from core.policy import (
    MISSING,
    Invalid,
    RuntimeKind,
    exceeds,
    validate_slots_for_runtime,
    validate_timeout_ms,
)
from server.families import registry
from server.families.base import MODES as MODES
from server.families.base import OPENAI_VOICES as OPENAI_VOICES
from server.families.base import SPEECH_RESPONSE_FORMATS, Family
from server.runtime.ports import ModelSpec

BACKENDS = {"numpy": "numpy", "cpu": "numpy", "opencl": "opencl", "cuda": "cuda"}
MAX_JSON_INT = 2**53 - 1
IGNORED_TOP = {
    "ui",
    "log_request_body",
    "model_spec_override",
    "voice_dir",
    "live_ingest",
    "min_free_memory_mb",
}
CONNECTION_KEYS = (
    "header_timeout_s",
    "body_read_timeout_s",
    "write_timeout_s",
    "shutdown_timeout_s",
    "send_buffer_bytes",
    "max_connections",
)
"""Client I/O deadlines and the socket send buffer (docs/server.md, "Slow and stalled clients")."""
LIMIT_KEYS = (
    "max_audio_seconds",
    "max_speech_seconds",
    "speech_seconds_per_char",
    "max_sentence_seconds",
    "max_input_chars",
)
"""Per-request limits (docs/server.md, "Limits")."""
MAX_ALIAS_CHARS = 64
MIN_BODY_BYTES = 1024
"""The smallest ``max_request_body_bytes``: room for any route's smallest useful body (a JSON
request of a few fields); below it every POST would get 413."""
MAX_ID_CHARS = 128
MODEL_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_ID_CHARS}}}")
MODEL_ID_RULE = f"1 to {MAX_ID_CHARS} letters, digits and . _ : -"
"""A model id: what a URL path (``/v1/models/{id}``) and a management load can address."""
IGNORED_MODEL = {
    "config",
    "weight",
    "model_spec_override",
    "live_ingest",
    "voice_presets",
    "default_voice_preset",
}


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending key."""


MODEL_KEYS = (
    "id",
    "family",
    "task",
    "mode",
    "path",
    "slots",
    "batching",
    "lazy",
    "backend",
    "device",
    "busy_timeout_ms",
    "memory_mb",
    "load_options",
    "session_options",
    "default_request_options",
    "voice_aliases",
)
"""The keys of a ``models[]`` entry that :func:`parse_model` reads (a management load's
body takes these and no others)."""


def is_model_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a usable model id (:data:`MODEL_ID_RULE`): the one rule for a
    config file's ids and a management load's."""
    return isinstance(value, str) and MODEL_ID.fullmatch(value) is not None


def unknown_model_keys(raw: Mapping[str, Any], ignored: Collection[str] = ()) -> list[str]:
    """The keys of a ``models[]`` entry that are not :data:`MODEL_KEYS` (nor ``ignored``),
    sorted and cut to 40 characters: a config file refuses them (it also takes audio.cpp's
    :data:`IGNORED_MODEL`), and so does a management load (which takes no others)."""
    return sorted(k[:40] for k in raw if k not in MODEL_KEYS and k not in ignored)


@attrs.frozen
class ModelConfig:
    """One ``models[]`` entry."""

    id: str
    family: str
    task: str
    mode: str = "offline"
    path: str = ""
    lazy: bool = True
    slots: int = 1
    slots_given: bool = False
    busy_timeout_ms: int | None = None
    memory_mb: int = 0
    backend: str = "numpy"
    device: str = "0"
    load_options: Mapping[str, Any] = attrs.field(factory=dict)
    session_options: Mapping[str, Any] = attrs.field(factory=dict)
    default_request_options: Mapping[str, str] = attrs.field(factory=dict)
    voice_aliases: Mapping[str, str] = attrs.field(factory=dict)
    batching: bool = False

    def spec(self) -> ModelSpec:
        """The runtime's view of this model."""
        return ModelSpec(
            id=self.id,
            family=self.family,
            task=self.task,
            mode=self.mode,
            slots=self.slots,
            path=self.path,
            backend=self.backend,
            device=self.device,
            load_options=dict(self.load_options),
            session_options=dict(self.session_options),
            busy_timeout_ms=self.busy_timeout_ms,
            memory_bytes=self.memory_mb * 1024 * 1024,
            lazy=self.lazy,
            batching=self.batching,
            extra={
                "default_request_options": dict(self.default_request_options),
                "voice_aliases": dict(self.voice_aliases),
            },
        )


@attrs.frozen
class ServerConfig:
    """The whole server configuration, validated."""

    host: str = "127.0.0.1"
    port: int = 8080
    cors_origins: str = ""
    ui_management: bool = False
    management_token: str | None = None
    backend: str = "numpy"
    device: str = "0"
    lazy_load: bool = True
    max_request_body_bytes: int = 64 * 1024 * 1024
    busy_timeout_ms: int = 300_000
    max_loaded_models: int = 0
    idle_unload_ms: int = 0
    memory_budget_mb: int = 0
    max_queue: int | None = None
    threads: int | None = None
    """BLAS threads per session call: a fixed count, or None (``"auto"``, the default): every
    core for a call running alone, ``cores // calls`` when several run (server/blas.py)."""
    audio_roots: tuple[str, ...] = ()
    runtime: RuntimeKind = RuntimeKind.PARALLEL
    models: tuple[ModelConfig, ...] = ()
    max_audio_seconds: float = 600.0
    max_speech_seconds: float = 600.0
    speech_seconds_per_char: float = 1.0
    max_sentence_seconds: float = 30.0
    max_input_chars: int = 20_000
    header_timeout_s: float = 5.0
    body_read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    shutdown_timeout_s: float = 30.0
    send_buffer_bytes: int = 0
    max_connections: int = 128


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"duplicate json object key: {key}")
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """JSON with duplicate keys rejected (as audio.cpp's parser does)."""
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"failed to parse json at byte {exc.pos}: {exc.msg}") from exc


def _int(
    raw: Mapping[str, Any], key: str, default: int, *, minimum: int = 0, where: str = ""
) -> int:
    value = raw.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise ConfigError(f"{where}{key} must be an integer")
    value = int(value)
    if value < minimum:
        raise ConfigError(f"{where}{key} must be >= {minimum}")
    if value > MAX_JSON_INT:
        raise ConfigError(f"{where}{key} is too large")
    return value


def _timeout_ms(raw: Mapping[str, Any], key: str, default: int, where: str = "") -> int:
    """A busy timeout in the config file: core.policy's one rule."""
    check = validate_timeout_ms(raw.get(key, default), key)
    if isinstance(check, Invalid):
        raise ConfigError(f"{where}{check.message}")
    return check.value


def _seconds(raw: Mapping[str, Any], key: str, default: float) -> float:
    """A positive number of seconds, at most :data:`MAX_JSON_INT` (a request limit or an I/O
    deadline): the bound keeps every product of it finite (``max_audio_seconds`` times a
    sample rate is a sample count; 1e308 would overflow to infinity)."""
    value = raw.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_JSON_INT
    ):
        raise ConfigError(f"{key} must be a number of seconds > 0 and <= {MAX_JSON_INT}")
    return float(value)


def _bool(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false")
    return value


def _backend(value: Any, where: str = "") -> str:
    if not isinstance(value, str) or value.lower() not in BACKENDS:
        raise ConfigError(
            f"{where}unsupported server backend: {value!r} (numpy, cpu, opencl, cuda)"
        )
    return BACKENDS[value.lower()]


def _options(raw: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}{key} must be an object")
    return dict(value)


def _load_options(raw: Mapping[str, Any], entry: Family, where: str) -> dict[str, Any]:
    """``load_options``, checked against what the family's loader accepts (its entry's)."""
    options = _options(raw, "load_options", where)
    family, known = entry.name, entry.load_options
    for key, value in options.items():
        if key not in known:
            raise ConfigError(
                f"{where}unknown load_options key {key[:40]!r} for family {family} "
                f"(known: {', '.join(known) or 'none'})"
            )
        allowed = known[key]
        if allowed is None and (not isinstance(value, str) or not value or "\0" in value):
            raise ConfigError(f"{where}load_options.{key} must be a non-empty path string")
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{where}load_options.{key} must be one of {', '.join(allowed)}")
    return options


def default_voice_aliases(family: str) -> dict[str, str]:
    """The alias table of a family: every OpenAI voice name and ``default`` to its first voice."""
    return registry.family(family).aliases()


def _voice_aliases(raw: Mapping[str, Any], entry: Family, where: str) -> dict[str, str]:
    """The default alias table with the model's ``voice_aliases`` over it (null removes one)."""
    table = entry.aliases()
    given = raw.get("voice_aliases")
    if given is None:
        return table
    family, voices = entry.name, entry.voices
    if not voices:
        raise ConfigError(f"{where}voice_aliases is only for TTS models")
    if not isinstance(given, Mapping):
        raise ConfigError(f"{where}voice_aliases must be an object of alias -> voice")
    for name, voice in given.items():
        if not name or len(name) > MAX_ALIAS_CHARS or "\0" in name:
            raise ConfigError(
                f"{where}voice_aliases names must be 1 to {MAX_ALIAS_CHARS} characters"
            )
        if name in voices:
            raise ConfigError(f"{where}voice_aliases: {name!r} is a voice, not an alias")
        if voice is None:
            table.pop(name, None)
        elif voice in voices:
            table[name] = voice
        else:
            raise ConfigError(
                f"{where}voice_aliases.{name} must name a voice of {family} ({', '.join(voices)})"
            )
    return table


def _stringify(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parse_model(
    raw: Any, server: Mapping[str, Any], runtime: RuntimeKind, base_dir: Path | None
) -> ModelConfig:
    """Validate one ``models[]`` entry: its id (:func:`is_model_id`), its keys
    (:func:`unknown_model_keys`; audio.cpp's :data:`IGNORED_MODEL` are taken and ignored), and
    its values, with ``server``'s defaults (``backend``, ``device``, ``lazy_load``) for what it
    leaves out; a ``memory_mb`` over ``server``'s ``memory_budget_mb`` (when set) is refused,
    since such a model could never load."""
    if not isinstance(raw, Mapping):
        raise ConfigError("every models[] entry must be an object")
    model_id = raw.get("id")
    if not is_model_id(model_id):
        raise ConfigError(f"models[].id is required: {MODEL_ID_RULE} (got {repr(model_id)[:40]})")
    where = f"model '{model_id}': "
    unknown = unknown_model_keys(raw, IGNORED_MODEL)
    if unknown:
        raise ConfigError(f"{where}unknown keys {unknown} (an entry takes {', '.join(MODEL_KEYS)})")
    family = raw.get("family")
    if not registry.is_family(family):
        raise ConfigError(f"{where}unknown family {family!r} ({registry.listing()})")
    entry = registry.family(family)
    task = raw.get("task", entry.task)
    if task != entry.task:
        raise ConfigError(f"{where}family {family} serves task '{entry.task}', not {task!r}")
    mode = raw.get("mode", "offline")
    if mode not in entry.modes:
        raise ConfigError(f"{where}mode must be {' or '.join(map(repr, entry.modes))}")
    batching = _bool(raw, "batching", False)
    if batching and not entry.batching:
        raise ConfigError(f"{where}family {family} cannot batch across requests (batching: true)")
    slots_raw = raw.get("slots", MISSING)
    checked = validate_slots_for_runtime(runtime, slots_raw, batching=batching)
    if isinstance(checked, Invalid):
        raise ConfigError(f"{where}{checked.message}")
    path = raw.get("path", "")
    if not isinstance(path, str) or "\0" in path:
        raise ConfigError(f"{where}path must be a string (without NUL bytes)")
    if path and entry.path_option is None:
        raise ConfigError(
            f"{where}family {family} takes no path: it runs its bundled weights (leave path out)"
        )
    if path and base_dir is not None and not os.path.isabs(path):
        path = str((base_dir / path).resolve())
    load_options = _load_options(raw, entry, where)
    model_dir = entry.model_dir(path, load_options)
    if model_dir and not os.path.isdir(model_dir):
        raise ConfigError(f"{where}model directory {model_dir!r} does not exist")
    missing = [f for f in entry.model_files if model_dir and not os.path.isfile(f"{model_dir}/{f}")]
    if missing:
        raise ConfigError(
            f"{where}model directory {model_dir!r} is not a {family} model: "
            f"it has no {', '.join(missing)}"
        )
    busy = raw.get("busy_timeout_ms")
    if busy is not None:
        busy = _timeout_ms(raw, "busy_timeout_ms", 0, where)
    memory_mb = _int(raw, "memory_mb", 0, where=where)
    budget_mb = _int(server, "memory_budget_mb", 0)
    if exceeds(memory_mb, budget_mb or None):  # core's residency rule, at startup
        raise ConfigError(
            f"{where}memory_mb={memory_mb} exceeds memory_budget_mb={budget_mb}: the model "
            "could never load (lower its memory_mb or raise memory_budget_mb)"
        )
    dro = _options(raw, "default_request_options", where)
    if entry.task == "tts" and dro.get("response_format", "wav") not in SPEECH_RESPONSE_FORMATS:
        raise ConfigError(
            f"{where}default_request_options.response_format must be one of "
            f"{', '.join(SPEECH_RESPONSE_FORMATS)}"
        )
    return ModelConfig(
        id=model_id,
        family=family,
        task=task,
        mode=mode,
        path=path,
        lazy=_bool(raw, "lazy", bool(server.get("lazy_load", True))),
        slots=checked.value,
        slots_given=slots_raw is not MISSING,
        busy_timeout_ms=busy,
        memory_mb=memory_mb,
        backend=_backend(raw.get("backend", server.get("backend", "numpy")), where),
        device=str(raw.get("device", server.get("device", 0))),
        load_options=load_options,
        session_options=_options(raw, "session_options", where),
        default_request_options={k: _stringify(v) for k, v in dro.items()},
        voice_aliases=_voice_aliases(raw, entry, where),
        batching=batching,
    )


def entry_of(spec: ModelSpec) -> dict[str, Any]:
    """:meth:`ModelConfig.spec` undone: a registered model's settings as the ``models[]``
    entry :func:`parse_model` gives them back from (what a load naming its id starts from).
    Its voice aliases are written over the family's default table: an alias the model
    removed is given as null."""
    aliases = dict(spec.extra.get("voice_aliases", {}))
    removed = {name: None for name in registry.family(spec.family).aliases() if name not in aliases}
    entry: dict[str, Any] = {
        "id": spec.id,
        "family": spec.family,
        "task": spec.task,
        "mode": spec.mode,
        "path": spec.path,
        "slots": spec.slots,
        "batching": spec.batching,
        "backend": spec.backend,
        "device": spec.device,
        "lazy": spec.lazy,
        "memory_mb": spec.memory_bytes // (1024 * 1024),
        "load_options": dict(spec.load_options),
        "session_options": dict(spec.session_options),
        "default_request_options": dict(spec.extra.get("default_request_options", {})),
    }
    if spec.busy_timeout_ms is not None:
        entry["busy_timeout_ms"] = spec.busy_timeout_ms
    if aliases or removed:
        entry["voice_aliases"] = {**removed, **aliases}
    return entry


def parse_config(
    raw: Any, *, runtime: RuntimeKind = RuntimeKind.PARALLEL, base_dir: Path | None = None
) -> ServerConfig:
    """Validate a parsed ``server.json`` object."""
    if not isinstance(raw, Mapping):
        raise ConfigError("the configuration must be a JSON object")
    known = {
        "host",
        "port",
        "cors_origins",
        "ui_management",
        "management_token",
        "backend",
        "device",
        "lazy_load",
        "max_request_body_bytes",
        "busy_timeout_ms",
        "max_loaded_models",
        "idle_unload_ms",
        "memory_budget_mb",
        "max_queue",
        "audio_roots",
        "models",
        "threads",
        "frontend_listener",
        "frontend_options",
        *IGNORED_TOP,
        *LIMIT_KEYS,
        *CONNECTION_KEYS,
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown configuration keys: {unknown}")
    if "frontend_listener" in raw or "frontend_options" in raw:
        raise ConfigError("frontend_listener is not supported by voxpool")
    port = _int(raw, "port", 8080, minimum=1)
    if port > 65535:
        raise ConfigError("port must be between 1 and 65535")
    cors = raw.get("cors_origins", "")
    if cors not in ("", "*"):
        raise ConfigError("cors_origins must be '' or '*'")
    ui_management = _bool(raw, "ui_management", False)
    models_raw = raw.get("models")
    if not isinstance(models_raw, list):
        raise ConfigError("models is required (an array)")
    if not models_raw and not ui_management:
        raise ConfigError("models is empty: register models dynamically with ui_management enabled")
    models = tuple(parse_model(m, raw, runtime, base_dir) for m in models_raw)
    ids = [m.id for m in models]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"duplicate server model id: {dup[0]}")
    roots = raw.get("audio_roots", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise ConfigError("audio_roots must be an array of directory paths")
    resolved_roots = tuple(
        str((base_dir / r).resolve())
        if base_dir and not os.path.isabs(r)
        else str(Path(r).resolve())
        for r in roots
    )
    token = raw.get("management_token")
    if token is not None and (not isinstance(token, str) or not token):
        raise ConfigError("management_token must be a non-empty string")
    max_queue = raw.get("max_queue")
    if max_queue is not None:
        max_queue = _int(raw, "max_queue", 0)
    host = raw.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ConfigError("host must be a non-empty string")
    return ServerConfig(
        host=host,
        port=port,
        cors_origins=cors,
        ui_management=ui_management,
        management_token=token,
        backend=_backend(raw.get("backend", "numpy")),
        device=str(raw.get("device", 0)),
        lazy_load=_bool(raw, "lazy_load", True),
        max_request_body_bytes=_int(
            raw, "max_request_body_bytes", 64 * 1024 * 1024, minimum=MIN_BODY_BYTES
        ),
        busy_timeout_ms=_timeout_ms(raw, "busy_timeout_ms", 300_000),
        max_loaded_models=_int(raw, "max_loaded_models", 0),
        idle_unload_ms=_int(raw, "idle_unload_ms", 0),
        memory_budget_mb=_int(raw, "memory_budget_mb", 0),
        max_queue=max_queue,
        threads=None
        if raw.get("threads", "auto") == "auto"
        else _int(raw, "threads", 1, minimum=1),
        audio_roots=resolved_roots,
        runtime=runtime,
        models=models,
        max_audio_seconds=_seconds(raw, "max_audio_seconds", 600.0),
        max_speech_seconds=_seconds(raw, "max_speech_seconds", 600.0),
        speech_seconds_per_char=_seconds(raw, "speech_seconds_per_char", 1.0),
        max_sentence_seconds=_seconds(raw, "max_sentence_seconds", 30.0),
        max_input_chars=_int(raw, "max_input_chars", 20_000, minimum=1),
        header_timeout_s=_seconds(raw, "header_timeout_s", 5.0),
        body_read_timeout_s=_seconds(raw, "body_read_timeout_s", 30.0),
        write_timeout_s=_seconds(raw, "write_timeout_s", 30.0),
        shutdown_timeout_s=_seconds(raw, "shutdown_timeout_s", 30.0),
        send_buffer_bytes=_int(raw, "send_buffer_bytes", 0),
        max_connections=_int(raw, "max_connections", 128),
    )


def load_config(path: str | Path, *, runtime: RuntimeKind = RuntimeKind.PARALLEL) -> ServerConfig:
    """Read and validate a ``server.json`` file (relative paths resolve against its folder)."""
    p = Path(path)
    return parse_config(
        parse_json(read_config_text(p)), runtime=runtime, base_dir=p.resolve().parent
    )


def read_config_text(path: str | Path) -> str:
    """A config file's text: UTF-8, with or without a byte order mark (which is dropped); a file
    that cannot be read or is not UTF-8 is a :class:`ConfigError` naming it."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    text = data.removeprefix(codecs.BOM_UTF8)
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = len(data) - len(text) + exc.start
        raise ConfigError(
            f"config {path} is not UTF-8 text: byte {at} is 0x{data[at]:02x} ({exc.reason})"
        ) from exc


def embedded_default(runtime: RuntimeKind = RuntimeKind.PARALLEL) -> ServerConfig:
    """The bundled models on numpy, lazily loaded, on 127.0.0.1:8080: one per registered family
    with an ``embedded`` model, its id the family's name; 2 slots each on the parallel runtime
    unless the family's embedded model says otherwise (Silero VAD: a batching model of 32
    engine rows, so live VAD works out of the box)."""
    parallel = runtime is RuntimeKind.PARALLEL
    models: list[dict[str, Any]] = [
        {"id": e.name, "family": e.name, **e.embedded}
        for e in registry.entries()
        if e.embedded is not None
    ]
    for m in models:
        if parallel:
            m.setdefault("slots", 2)  # a family's embedded model may set its own
        else:  # the original runtime: one session per model, no batching
            for key in PARALLEL_ONLY:
                m.pop(key, None)
    return parse_config({"models": models, "lazy_load": True}, runtime=runtime)


PARALLEL_ONLY = ("slots", "batching")
"""Model keys the embedded default drops on the original runtime."""
