"""Find a mutant of the test catalogue by name (for ``voxpool sim fuzz --mutant NAME``).

The mutants (the real core/runtime with one historical bug put back) live with
the tests, in ``tests/mutants/catalogue.py``; this loads that catalogue from a
source checkout so the fuzzer's command line can demonstrate finding them.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

CATALOGUE = "tests.mutants.catalogue"


def mutant(name: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The patch (a context-manager factory) of mutant ``name``; KeyError lists the known ones."""
    root = str(Path(__file__).resolve().parent.parent)
    if not (Path(root) / "tests" / "mutants" / "catalogue.py").exists():
        raise KeyError("mutants need a source checkout (tests/mutants/catalogue.py)")
    if root not in sys.path:
        sys.path.insert(0, root)
    catalogue = importlib.import_module(CATALOGUE)
    if name not in catalogue.MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(sorted(catalogue.SIMULATED))}")
    if name not in catalogue.SIMULATED:
        raise KeyError(f"mutant {name!r} is not in code the simulator runs (see tests/mutants)")
    return catalogue.MUTANTS[name].patch  # type: ignore[no-any-return]
