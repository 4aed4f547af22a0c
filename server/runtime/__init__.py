"""The async runtime: an anyio driver of :mod:`core` (runs under trio and asyncio).

It owns every task, event and timeout; core makes every decision. Session work
goes through a :class:`~server.runtime.ports.ModelProvider`: real models run it
in worker threads, the simulator's fakes take virtual time. Only :mod:`core`
is imported here, so the simulator runs this very code without any model or
array library.
"""

from server.runtime.errors import (
    BusyError,
    InvalidRequestError,
    LoadError,
    NotFoundError,
    RuntimeErrorBase,
)
from server.runtime.ports import Clock, ModelProvider, ModelSpec, SystemClock
from server.runtime.runtime import Held, Runtime
from server.runtime.state import RuntimeConfig

__all__ = [
    "BusyError",
    "Clock",
    "Held",
    "InvalidRequestError",
    "LoadError",
    "ModelProvider",
    "ModelSpec",
    "NotFoundError",
    "Runtime",
    "RuntimeConfig",
    "RuntimeErrorBase",
    "SystemClock",
]
