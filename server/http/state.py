"""The server's shared state: configuration, runtime, metrics, and model lookups."""

from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

import attrs
from starlette.requests import Request

from core.policy import RuntimeKind
from server.config import ServerConfig
from server.families import registry
from server.http.errors import ApiError, bad, show
from server.metrics import Metrics
from server.runtime import Runtime
from server.runtime.errors import NotFoundError
from server.runtime.ports import ModelSpec


@attrs.define
class ServerState:
    """Everything a handler needs."""

    config: ServerConfig
    runtime: Runtime
    metrics: Metrics
    backend: str
    started: float = attrs.field(factory=time.time)
    loaded_at: dict[str, int] = attrs.field(factory=dict)
    """Model id -> Unix seconds of its last management load (``/v1/models``' ``created``;
    configured models not loaded since: :attr:`started`). Kept here, not in the runtime's
    specs: wall time is the HTTP layer's, never the runtime's or the simulator's."""

    def created(self, model_id: str) -> int:
        """``/v1/models``' ``created`` of ``model_id`` (see :attr:`loaded_at`)."""
        return self.loaded_at.get(model_id, int(self.started))

    @property
    def management_token(self) -> str | None:
        return self.config.management_token or os.environ.get("VOXPOOL_MANAGEMENT_TOKEN") or None

    def spec(self, model_id: Any, task: str | None = None, field: str = "model") -> ModelSpec:
        """The spec of a model named in a request's ``field``.

        400 if missing, 404 if unknown, 400 on task mismatch.
        """
        if model_id is None:
            raise bad(f"'{field}' is required")
        if not isinstance(model_id, str) or not model_id:
            raise bad(f"'{field}' must be a non-empty string naming a model")
        try:
            spec = self.runtime.spec(model_id)
        except NotFoundError:
            raise ApiError(404, f"unknown model id: {show(model_id)}", "not_found_error") from None
        if task is not None and spec.task != task:
            raise bad(f"model '{model_id}' serves task '{spec.task}', not '{task}'")
        return spec

    def adapter(self, spec: ModelSpec) -> Any:
        """The HTTP adapter of ``spec``'s family (its registry entry's)."""
        return registry.family(spec.family).adapter()

    def is_manager(self, request: Request) -> bool:
        """Management is on and the request carries the right bearer token."""
        token = self.management_token
        if not self.config.ui_management or token is None:
            return False
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        return secrets.compare_digest(given.encode(), token.encode())

    def check_management(self, request: Request) -> None:
        """403 unless management is on and the bearer token matches."""
        if not self.config.ui_management:
            raise ApiError(403, "dynamic model management is disabled", "permission_error")
        if not self.is_manager(request):
            raise ApiError(
                403, "model management requires a valid bearer token", "permission_error"
            )

    def local_audio(self, path: Any) -> bytes:
        """Read a server-local audio file, only under the configured ``audio_roots`` (blocking: call
        it in a worker thread). Only regular files, at most ``max_request_body_bytes`` long."""
        if not isinstance(path, str) or not path:
            raise bad("audio path must be a non-empty string")
        if "\0" in path:
            raise bad("audio path must not contain NUL bytes")
        if not self.config.audio_roots:
            raise bad("server-local audio paths are disabled (configure audio_roots)")
        real = Path(os.path.realpath(path))
        limit = self.config.max_request_body_bytes
        for root in self.config.audio_roots:
            root_path = Path(os.path.realpath(root))
            if real == root_path or root_path in real.parents:
                try:
                    # non-blocking open: a FIFO under a root must not hang the worker thread
                    with os.fdopen(os.open(real, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                            raise bad("audio path is not a regular file")
                        data = f.read(limit + 1)
                except OSError as exc:
                    raise bad(f"cannot read audio path: {exc.strerror}") from None
                if len(data) > limit:
                    raise ApiError(413, f"audio file exceeds max_request_body_bytes={limit}")
                return data
        raise bad("audio path is outside the configured audio_roots")

    @property
    def parallel(self) -> bool:
        return self.config.runtime is RuntimeKind.PARALLEL
