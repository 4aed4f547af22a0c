"""Our text -> phoneme ids pipeline gives exactly piper-tts's ids, sentence by sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.piper.loader import load_config, voice_paths
from backends.piper.phonemize import phoneme_ids, phonemize

FIXTURE = Path(__file__).parents[1] / "data" / "piper" / "phoneme_ids.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]


def _ours(text: str) -> list[list[int]]:
    config = load_config()
    return [phoneme_ids(p, config) for p in phonemize(text, config) if p]


def _piper(text: str) -> list[list[int]]:
    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    config = PiperConfig.from_dict(json.loads(voice_paths()[1].read_text(encoding="utf-8")))
    voice = PiperVoice(session=None, config=config)  # type: ignore[arg-type]  # phonemize needs no session
    return [voice.phonemes_to_ids(p) for p in voice.phonemize(text) if p]


def test_fixture_has_twenty_texts_and_multi_sentence_cases() -> None:
    assert len(CASES) == 20
    assert sum(len(c["ids"]) > 1 for c in CASES) >= 3


@pytest.mark.parametrize("case", CASES, ids=[c["text"][:24] for c in CASES])
def test_phoneme_ids_match_piper(case: dict[str, object]) -> None:
    ours = _ours(str(case["text"]))
    assert ours == case["ids"]  # as recorded from piper-tts
    assert ours == _piper(str(case["text"]))  # and as the installed piper-tts says now


def test_ids_are_bos_pad_interspersed_eos() -> None:
    config = load_config()
    (ids,) = [phoneme_ids(p, config) for p in phonemize("Hi.", config)]
    pad, bos, eos = (
        config.phoneme_id_map["_"][0],
        config.phoneme_id_map["^"][0],
        config.phoneme_id_map["$"][0],
    )
    assert ids[0] == bos and ids[-1] == eos
    assert ids[1:-1:2] == [pad] * ((len(ids) - 1) // 2)
    assert pad not in ids[2:-1:2]


def test_empty_text_has_no_sentences() -> None:
    assert _ours("") == []
    assert _ours("   ") == _piper("   ")
