"""Where numba keeps the compiled kernels: a folder named after every source they come from.

numba's ``cache=True`` checks a cached kernel against its own source file only (the
file's SHA-256). Our kernels compile in helpers from other modules (the intrinsics of
:mod:`backends.intrinsics`, :mod:`backends.piper.winograd_kernels`' transforms,
:func:`backends.kernels.gate_rows`, the resblock helpers the coupling tiles share), so an
edit to a helper left the callers' old machine code in the cache, loaded by every later
import: the old helper ran against the new buffers, without bounds checks (an outside
review reproduced it, making ``resblock_tiles.zero_outside`` a no-op that the cached
coupling kernel kept doing). This module names the cache folder after a digest of every
module of the package (:func:`digest`): a change anywhere in ``backends`` gives a new
folder, so every kernel compiles afresh once, and a folder no other digest uses is never
read. Folders of other digests beside it are removed (best effort: a process still
running older code that finds its files gone compiles again; numba treats a missing file
as a miss).

The folder is ``backends/__pycache__/numba-<digest>`` where that is writable, else
``$XDG_CACHE_HOME/voxpool`` (``~/.cache/voxpool``) ``/numba-<digest>``; where neither
is, :data:`CACHE_DIR` is None and the kernels are compiled at every start (4-6 s) rather
than cached where staleness could not be told.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
PREFIX = "numba-"


def digest(root: Path = PACKAGE) -> str:
    """A digest of every ``.py`` file under ``root`` (paths and contents, in path order)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _bases() -> list[Path]:
    user = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return [PACKAGE / "__pycache__", Path(user) / "voxpool"]


def choose(name: str, bases: list[Path]) -> Path | None:
    """The first ``base / name`` that can be made and written to (other ``numba-*``
    folders in that base removed); None where none can."""
    for base in bases:
        target = base / name
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=target):
                pass
        except OSError:
            continue
        for old in base.glob(f"{PREFIX}*"):
            if old != target and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return target
    return None


def _find() -> str | None:
    found = choose(PREFIX + digest(), _bases())
    return None if found is None else str(found)


CACHE_DIR = _find()
"""The folder the kernels are cached in for this source tree (None: not cached)."""


@contextmanager
def cache_dir(config: Any) -> Iterator[None]:
    """numba's ``config.CACHE_DIR`` set to :data:`CACHE_DIR` while a kernel is decorated
    (numba picks a function's cache folder then), and given back after, so other numba
    users in the process keep their own."""
    before = config.CACHE_DIR
    config.CACHE_DIR = CACHE_DIR or before
    try:
        yield
    finally:
        config.CACHE_DIR = before
