"""The async runtime that drives core, the HTTP app, configuration and the CLI."""

import backends  # noqa: F401  # first: sets OpenBLAS's environment before numpy loads
