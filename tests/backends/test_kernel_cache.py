"""The compiled kernels' cache folder follows every source of the package (an edited helper
is never run from a stale cache)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

from backends import kernel_cache, kernels
from backends.intrinsics import HALVES
from backends.piper import coupling_tiles


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_digest_changes_with_any_file_of_the_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path / "pkg", {"a.py": "x = 1\n", "sub/b.py": "y = 2\n", "notes.txt": "n"})
    before = kernel_cache.digest(root)
    assert kernel_cache.digest(root) == before  # stable
    (root / "notes.txt").write_text("other")  # not a source
    assert kernel_cache.digest(root) == before
    (root / "sub/b.py").write_text("y = 3\n")  # a helper in another module
    changed = kernel_cache.digest(root)
    assert changed != before
    (root / "sub/b.py").rename(root / "sub/c.py")  # same contents, another module
    assert kernel_cache.digest(root) not in (before, changed)


def test_the_folder_is_the_first_writable_base_and_older_folders_go(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    base = tmp_path / "cache"
    (base / "numba-old").mkdir(parents=True)
    (base / "numba-old" / "k.nbi").write_text("stale")
    (base / "other").mkdir()
    found = kernel_cache.choose("numba-new", [blocked / "sub", base])
    assert found == base / "numba-new" and found.is_dir()
    assert not (base / "numba-old").exists()  # another digest's folder: removed
    assert (base / "other").is_dir()  # not ours: kept
    assert kernel_cache.choose("numba-new", [blocked / "sub"]) is None


def test_a_trees_folders_for_halves_and_float32_panels_are_kept_side_by_side(
    tmp_path: Path,
) -> None:
    """Which helper the hand-over kernels compile in for halves follows HALVES, which
    numba's key does not see: each kind has its folder, and neither removes the other."""
    base = tmp_path / "cache"
    names = [kernel_cache.folder_name("abc", halves) for halves in (True, False)]
    assert names == ["numba-abc-halves", "numba-abc-float32"]
    (base / "numba-old-halves").mkdir(parents=True)
    for name in names:
        assert kernel_cache.choose(name, [base], keep="numba-abc-") == base / name
    assert sorted(p.name for p in base.iterdir()) == sorted(names)  # other digests: gone


def test_the_setting_is_numbas_only_while_a_kernel_is_decorated() -> None:
    config = SimpleNamespace(CACHE_DIR="/theirs")
    with kernel_cache.cache_dir(config):
        inside = config.CACHE_DIR
    assert inside == (kernel_cache.CACHE_DIR or "/theirs")
    assert config.CACHE_DIR == "/theirs"


def test_the_kernels_are_cached_in_the_folder_of_this_source_tree() -> None:
    assert kernel_cache.CACHE_DIR is not None  # the checkout's __pycache__ is writable here
    name = kernel_cache.folder_name(kernel_cache.digest(), HALVES)
    assert Path(kernel_cache.CACHE_DIR).name == name
    for dispatcher in (kernels.gate_rows, coupling_tiles._tiles):
        path = dispatcher._cache._cache_path
        assert path.startswith(kernel_cache.CACHE_DIR), path


def test_an_edited_helper_in_another_module_is_compiled_again(tmp_path: Path) -> None:
    """What numba alone gets wrong: a kernel in ``a.py`` inlines a helper from ``b.py``;
    editing ``b.py`` must change what the cached kernel computes in the next process."""
    pkg = _tree(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "b.py": "from numba import njit\n\n@njit\ndef helper(x):\n    return x + 1\n",
            "a.py": textwrap.dedent(
                """
                from pathlib import Path
                from numba import njit
                from numba.core import config
                from backends import kernel_cache
                from pkg.b import helper

                HERE = Path(__file__).parent
                NAME = kernel_cache.PREFIX + kernel_cache.digest(HERE)
                kernel_cache.CACHE_DIR = str(kernel_cache.choose(NAME, [HERE / "__pycache__"]))
                with kernel_cache.cache_dir(config):
                    @njit(cache=True)
                    def kernel(x):
                        return helper(x) * 10
                """
            ),
        },
    )
    root = Path(kernel_cache.__file__).resolve().parents[1]
    env_path = f"{tmp_path}:{root}"

    def value() -> str:
        code = "from pkg.a import kernel; print(kernel(1))"
        run = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            # no .pyc: Python keys one by the source's size and mtime in whole seconds, and
            # the edit below keeps the size; done within the second of the first write, a
            # stale b.pyc ran the old helper (a flake seen twice on an idle machine)
            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        return run.stdout.strip()

    assert value() == "20"
    assert value() == "20"  # from the cache
    (pkg / "b.py").write_text("from numba import njit\n\n@njit\ndef helper(x):\n    return x + 2\n")
    assert value() == "30"
