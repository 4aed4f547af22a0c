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

The folder is ``backends/__pycache__/numba-<digest>-<panels>`` where that is writable,
else ``$XDG_CACHE_HOME/voxpool`` (``~/.cache/voxpool``) ``/numba-<digest>-<panels>``;
where neither is, :data:`CACHE_DIR` is None and the kernels are compiled at every start
(4-6 s) rather than cached where staleness could not be told. ``<panels>`` is ``halves``
or ``float32``, :data:`backends.intrinsics.HALVES`: which helper the hand-over kernels
compile in for halves (the conversion, or nothing) follows that flag, which numba's own
key does not see (its key is the signature, the CPU's name and features, the source):
a process told ``NUMBA_CPU_NAME=<this very CPU>`` has no halves and the same numba key,
and its kernels, cached first in a shared folder, left a later process's halves
products on the helpers unwritten (an outside review reproduced it). The two kinds of
folder of one digest are kept side by side.
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

from backends.intrinsics import HALVES

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


def choose(name: str, bases: list[Path], keep: str | None = None) -> Path | None:
    """The first ``base / name`` that can be made and written to (other ``numba-*``
    folders in that base removed but those whose names start with ``keep``); None where
    none can."""
    for base in bases:
        target = base / name
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=target):
                pass
        except OSError:
            continue
        for old in base.glob(f"{PREFIX}*"):
            if old != target and old.is_dir() and not (keep and old.name.startswith(keep)):
                shutil.rmtree(old, ignore_errors=True)
        return target
    return None


def folder_name(source_digest: str, halves: bool) -> str:
    """The cache folder of a source tree and a kind of panels (see the module doc)."""
    return f"{PREFIX}{source_digest}-{'halves' if halves else 'float32'}"


def _find() -> str | None:
    tree = digest()
    found = choose(folder_name(tree, HALVES), _bases(), keep=f"{PREFIX}{tree}-")
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
