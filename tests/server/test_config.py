"""Configuration mistakes are startup errors naming the key and the problem (a
:class:`ConfigError`, which ``voxpool serve`` turns into one line and exit 2), never a
traceback and never a server that starts and then fails every request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.cli import main
from server.config import (
    MAX_JSON_INT,
    MIN_BODY_BYTES,
    ConfigError,
    is_model_id,
    load_config,
    parse_config,
    unknown_model_keys,
)


def config(**top: Any) -> dict[str, Any]:
    """A valid configuration of one Silero VAD model, with ``top`` over it."""
    return {"models": [{"id": "vad", "family": "silero_vad"}], **top}


def test_a_model_over_the_whole_memory_budget_is_refused() -> None:
    models = [{"id": "vad", "family": "silero_vad", "memory_mb": 100, "slots": 2}]
    with pytest.raises(
        ConfigError, match=r"model 'vad': memory_mb=100 exceeds memory_budget_mb=10"
    ):
        parse_config({"memory_budget_mb": 10, "models": models})
    fits = parse_config({"memory_budget_mb": 100, "models": models})
    assert fits.models[0].memory_mb == 100
    assert parse_config({"models": models}).memory_budget_mb == 0  # no budget: any estimate


def test_unknown_model_keys_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"model 'a': unknown keys \['slotz'\]"):
        parse_config({"models": [{"id": "a", "family": "piper", "slotz": 2}]})
    # audio.cpp's model keys are taken and ignored in a file; a management load takes none
    entry = {"id": "a", "family": "piper", "weight": "x.gguf", "config": "c.json"}
    assert parse_config({"models": [entry]}).models[0].id == "a"
    assert unknown_model_keys(entry) == ["config", "weight"]
    with pytest.raises(ConfigError, match=r"unknown configuration keys: \['modelz'\]"):
        parse_config(config(modelz=[]))


@pytest.mark.parametrize("model_id", ["a b/c", "a/b", "", "é", "x" * 129, 7, None])
def test_a_model_id_must_be_addressable(model_id: object) -> None:
    assert not is_model_id(model_id)
    with pytest.raises(ConfigError, match=r"models\[\]\.id is required: 1 to 128 letters"):
        parse_config({"models": [{"id": model_id, "family": "piper"}]})


def test_the_id_rule_takes_what_urls_can_address() -> None:
    assert all(is_model_id(i) for i in ("piper", "whisper-large_v3.1:q8", "x" * 128))


def test_a_config_file_must_be_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bom.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"bom\.json is not UTF-8 text: byte 0 is 0xff"):
        load_config(bad)
    bom = tmp_path / "utf8bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"models": [{"id": "vad", "family": "silero_vad"}]}')
    assert load_config(bom).models[0].id == "vad"  # a UTF-8 byte order mark is dropped
    with pytest.raises(ConfigError, match=r"cannot read config .*missing\.json"):
        load_config(tmp_path / "missing.json")


def test_serve_turns_a_bad_file_into_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bom.json"
    bad.write_bytes(b"\xff\xfe{}")
    assert main(["serve", "--parallel-jobs", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("voxpool serve: config ") and "not UTF-8" in err
    assert "\n" not in err and "Traceback" not in err


def test_the_body_limit_has_a_minimum() -> None:
    for small in (0, 1, MIN_BODY_BYTES - 1):
        with pytest.raises(
            ConfigError, match=f"max_request_body_bytes must be >= {MIN_BODY_BYTES}"
        ):
            parse_config(config(max_request_body_bytes=small))
    assert parse_config(config(max_request_body_bytes=MIN_BODY_BYTES)).max_request_body_bytes == (
        MIN_BODY_BYTES
    )
    with pytest.raises(ConfigError, match="max_input_chars must be >= 1"):
        parse_config(config(max_input_chars=0))


@pytest.mark.parametrize("value", [1e308, MAX_JSON_INT + 2.0, 0, -1, True, "600"])
def test_a_seconds_limit_states_its_bound(value: object) -> None:
    with pytest.raises(
        ConfigError,
        match=f"max_audio_seconds must be a number of seconds > 0 and <= {MAX_JSON_INT}",
    ):
        parse_config(config(max_audio_seconds=value))
    assert parse_config(config(max_audio_seconds=MAX_JSON_INT)).max_audio_seconds == MAX_JSON_INT
