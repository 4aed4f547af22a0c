"""``voxpool serve``: run the HTTP server until SIGINT/SIGTERM, then drain and exit 0.

With no ``--config`` it serves the embedded default: the three bundled models
on numpy, lazily loaded, on 127.0.0.1:8080. ``--parallel-jobs`` selects the
parallel runtime (fixed for the process); without it any explicit ``slots``
in the config is a startup error, as in audio.cpp. ``--log-level`` sets how
much of voxpool's log (``voxpool.*`` loggers: the access log, errors with
their request ids) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import logging
import os
import sys
from typing import IO

import attrs

from core.policy import select_runtime
from server.config import ConfigError, ServerConfig, embedded_default, load_config
from server.provider import BackendUnavailable, check_backends

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_HANDLER = "voxpool-stderr"


def configure_logging(level: str) -> None:
    """voxpool's loggers at ``level`` (debug, info, warning, error), other libraries' at
    warning or above, one handler on stderr."""
    threshold = logging.getLevelNamesMapping()[level.upper()]
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == LOG_HANDLER]:
        root.removeHandler(old)  # called again in one process (tests): one handler, not two
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(LOG_HANDLER)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(max(threshold, logging.WARNING))
    logging.getLogger("voxpool").setLevel(threshold)


def main(args: argparse.Namespace) -> int:
    configure_logging(getattr(args, "log_level", "info"))
    runtime_kind = select_runtime(bool(args.parallel_jobs))
    try:
        config = (
            load_config(args.config, runtime=runtime_kind)
            if args.config
            else embedded_default(runtime_kind)
        )
    except ConfigError as exc:
        print(f"voxpool serve: {exc}", file=sys.stderr)
        return 2
    if args.host:
        config = attrs.evolve(config, host=args.host)
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            print("voxpool serve: --port must be between 1 and 65535", file=sys.stderr)
            return 2
        config = attrs.evolve(config, port=args.port)
    if config.ui_management and not (
        config.management_token or os.environ.get("VOXPOOL_MANAGEMENT_TOKEN")
    ):
        print(
            "voxpool serve: ui_management needs a bearer token: set management_token in the config "
            "or VOXPOOL_MANAGEMENT_TOKEN",
            file=sys.stderr,
        )
        return 2
    try:  # models load lazily: find an unusable backend now, not at the first request
        check_backends(model.spec() for model in config.models)
    except BackendUnavailable as exc:
        print(f"voxpool serve: {exc}", file=sys.stderr)
        return 2
    config = attrs.evolve(config, threads=limit_blas_threads(config.threads))
    enable_faulthandler()
    import trio

    with contextlib.ExitStack() as stack:
        trace: IO[str] | None = stack.enter_context(open(args.trace, "w")) if args.trace else None
        code = trio.run(serve, config, trace)
    return code


def enable_faulthandler() -> None:
    """A native crash (a BLAS, a compiled kernel) then leaves every thread's Python stack on
    stderr, in the log. Left alone where it is on already (``PYTHONFAULTHANDLER``, or
    pytest's, when a test calls ``serve`` in-process) or where stderr is no file."""
    if faulthandler.is_enabled():
        return
    with contextlib.suppress(AttributeError, ValueError, RuntimeError, io.UnsupportedOperation):
        faulthandler.enable()


BLAS_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads(threads: int | None) -> int | None:
    """Set up BLAS threads for the process; returns the fixed count, or None when they adapt.

    ``threads`` is the config's: a fixed count per session call, or None (``"auto"``):
    the BLAS thread pool gets every core this process may use and the provider
    sets each call's share (server/blas.py). An explicit ``OPENBLAS_NUM_THREADS`` /
    ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment wins: a fixed count.
    """
    from server.blas import cores

    explicit = next((os.environ[v] for v in BLAS_VARIABLES if os.environ.get(v)), None)
    if explicit is not None and explicit.isdigit() and int(explicit) >= 1:
        threads = int(explicit)
    pool = threads if threads is not None else cores()
    for var in BLAS_VARIABLES:
        if not os.environ.get(var):  # unset or empty: ours to set
            os.environ[var] = str(pool)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return threads
    if "numpy" in sys.modules:
        threadpool_limits(limits=pool, user_api="blas")
    return threads


async def serve(config: ServerConfig, trace: IO[str] | None) -> int:
    """Serve until SIGINT/SIGTERM, drain within ``shutdown_timeout_s``, tear down.

    See :mod:`server.http.run`.
    """
    from server.http.run import serve as run_server

    return await run_server(config, trace)
