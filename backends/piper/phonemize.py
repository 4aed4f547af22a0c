"""Text -> sentences of phonemes -> phoneme ids, exactly as piper-tts does it.

The phonemes come from piper-tts's own espeak-ng bridge (``piper.espeakbridge``,
with the espeak-ng data it ships), so they are piper's by construction. espeak-ng
is one global, non-reentrant engine, so every call holds piper's phonemizer lock
(its own module-level lock, shared with any ``PiperVoice`` in the process) and
reuses piper's engine instance rather than initialising espeak-ng a second time.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from backends.piper.loader import VoiceConfig

PAD, BOS, EOS = "_", "^", "$"
_RAW_PHONEMES = re.compile(r"(\[\[.*?\]\])")
_FALLBACK_LOCK = threading.Lock()


def _espeak() -> tuple[Any, Any]:
    """(phonemizer, lock) shared with piper.voice; created on first use."""
    from piper import voice as piper_voice
    from piper.phonemize_espeak import ESPEAK_DATA_DIR, EspeakPhonemizer

    lock = getattr(piper_voice, "_ESPEAK_PHONEMIZER_LOCK", _FALLBACK_LOCK)
    with lock:
        engine = getattr(piper_voice, "_ESPEAK_PHONEMIZER", None)
        if engine is None:
            engine = EspeakPhonemizer(ESPEAK_DATA_DIR)
            if hasattr(piper_voice, "_ESPEAK_PHONEMIZER"):
                piper_voice._ESPEAK_PHONEMIZER = engine
    return engine, lock


def phonemize(text: str, config: VoiceConfig) -> list[list[str]]:
    """Phonemes per sentence (piper's sentence split), ``[[ raw phonemes ]]`` passed through."""
    engine, lock = _espeak()
    clusters = set(config.vowel_clusters) if config.vowel_clusters else None
    sentences: list[list[str]] = []
    parts = _RAW_PHONEMES.split(text)
    prev_raw = False
    for i, part in enumerate(parts):
        if part.startswith("[["):
            prev_raw = True
            if not sentences:
                sentences.append([])
            if i > 0 and parts[i - 1].endswith(" "):
                sentences[-1].append(" ")
            sentences[-1].extend(part[2:-2].strip())
            if i < len(parts) - 1 and parts[i + 1].startswith(" "):
                sentences[-1].append(" ")
            continue
        with lock:
            found = engine.phonemize(config.espeak_voice, part, vowel_clusters=clusters)
        if prev_raw and found:
            sentences[-1].extend(found[0])
            found = found[1:]
        sentences.extend(found)
        prev_raw = False
    if sentences and not sentences[-1]:
        sentences.pop()
    return sentences


def phoneme_ids(phonemes: Sequence[str], config: VoiceConfig) -> list[int]:
    """BOS, then each known phoneme followed by PAD, then EOS (unknown phonemes skipped)."""
    id_map = config.phoneme_id_map
    ids = [*id_map[BOS], *id_map[PAD]]
    for ph in phonemes:
        if ph in id_map:
            ids.extend(id_map[ph])
            ids.extend(id_map[PAD])
    ids.extend(id_map[EOS])
    return ids
