"""The model deployment: each Ray Serve replica is one voxpool server without a socket.

A replica builds the same state and ASGI app as ``voxpool serve`` (runtime,
provider, metrics; admission, slots, lifecycle, batching, residency) and
replays the requests the ingress forwards (:mod:`server.ray.exchange`).

Ray Serve's model multiplexing tells the router which replica has which model:
the loader (:meth:`VoxpoolReplica.resident`) only marks a model as wanted here
(the runtime loads it with the request, as it does in ``voxpool serve``), and
after every request the list Ray holds is trimmed to the models the runtime
really keeps (:func:`server.ray.multiplex.trim`), so our residency limits
(``max_loaded_models``, ``memory_budget_mb``, ``idle_unload_ms``), not Ray's
LRU, decide what a replica keeps.

Every :data:`REPORT_INTERVAL_S` the replica sends its ``/v1/models`` and
``/metrics`` to the fleet directory (:mod:`server.ray.directory`), from which
the ingress answers the fleet-wide views, and runs the management commands
the directory hands back (load, unload, bulk unload: every replica runs them).
Ray's graceful shutdown waits for the replica's requests to end, then
:meth:`VoxpoolReplica.__del__` tears the runtime down (every pool closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator

import attrs
from ray import serve

from server.cmd_serve import limit_blas_threads
from server.config import ServerConfig
from server.http.app import build_app
from server.http.lifespan import lifespan
from server.http.routes_models import model_rows
from server.ray import multiplex
from server.ray.directory import Ack, Command, Report, directory
from server.ray.exchange import Forwarded, Part, Start, complete, replay
from server.serving import make_state

log = logging.getLogger("voxpool.ray")

REPORT_INTERVAL_S = 0.5
"""How often a replica sends its counters to the fleet directory."""


class VoxpoolReplica:
    """One replica of the model deployment (wrapped by ``serve.deployment`` in
    :mod:`server.ray.app`)."""

    async def __init__(self, config: ServerConfig, app_name: str) -> None:  # type: ignore[misc]
        # BLAS threads as `voxpool serve` sets them; Ray's OMP_NUM_THREADS (the replica's
        # CPU reservation) is an explicit count and wins, as the environment's does there
        config = attrs.evolve(config, threads=limit_blas_threads(config.threads))
        self.state = make_state(config)
        self.app = build_app(self.state)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.app_name = app_name
        self.directory = directory(app_name)
        self.epoch, self.done = "", 0  # how far this replica ran the directory's command log
        self.handling: Counter[str] = Counter()  # the models of the requests being served here
        self._stop = asyncio.Event()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._life = asyncio.ensure_future(self._hold(started))
        await started
        self._reporter = asyncio.ensure_future(self._report_forever())

    async def _hold(self, started: asyncio.Future[None]) -> None:
        """Run the app's lifespan (the runtime's task group) until the replica stops."""
        try:
            async with lifespan(self.app):
                started.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    @serve.multiplexed(max_num_models_per_replica=-1)  # type: ignore[untyped-decorator]
    async def resident(self, model_id: str) -> str:
        """Mark ``model_id`` as wanted on this replica (Ray routes its requests here).

        The runtime loads it with the first request; a model the runtime does
        not keep is dropped from Ray's list again by :func:`multiplex.trim`.
        """
        return model_id

    async def handle(self, request: Forwarded) -> AsyncIterator[Part]:
        """Serve one forwarded request; yield its response head, then its body."""
        model = serve.get_multiplexed_model_id()
        self.handling[model] += 1
        try:
            if model:
                await self.resident(model)
            async for part in replay(self.app, request):
                yield (
                    attrs.evolve(part, replica=self.replica_id) if isinstance(part, Start) else part
                )
        finally:
            self.handling -= Counter({model: 1})
            self._trim()

    def _trim(self) -> None:
        """Bring Ray's list of this replica's models in line with the runtime's.

        A model stays listed while a request for it is being served here, even
        before the runtime has admitted it (its upload still being read): a
        report trimming it then would lose the load that request makes.
        """
        kept = {
            row.id
            for row in self.state.runtime.status()
            if row.loaded or row.active_slots or row.queued_requests
        }
        multiplex.trim(self, kept | self.handling.keys())

    def report(self) -> Report:
        """This replica's ``/v1/models`` rows and ``/metrics`` as the directory keeps them
        (read from the state: the app's own request metrics do not count the reports)."""
        rows = model_rows(self.state, manager=False)
        metrics = self.state.metrics.render().decode()
        return Report(self.replica_id, rows, metrics, tuple(multiplex.listed(self)))

    async def run_commands(self, commands: list[Command]) -> None:
        """Run the fleet's management commands in order through this replica's app."""
        for command in commands:
            status, body = await complete(self.app, command.request)
            await self.directory.ack.remote(command.seq, Ack(self.replica_id, status, body))
            self.epoch, self.done = command.epoch, command.seq

    async def _report_forever(self) -> None:
        while not self._stop.is_set():
            self._trim()
            try:
                report = self.report()
                await self.run_commands(
                    await self.directory.report.remote(report, self.epoch, self.done)
                )
            except Exception:  # its owner went away: start (or find) a new one, keep serving
                log.debug("replica %s could not report to the directory", self.replica_id)
                self.directory = directory(self.app_name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), REPORT_INTERVAL_S)

    async def check_health(self) -> None:
        """Ray's health check: the runtime's lifespan must still be running."""
        if self._life.done():
            raise RuntimeError("the voxpool runtime of this replica has stopped")

    async def __del__(self) -> None:
        """Ray's graceful shutdown (requests already drained): tear the runtime down."""
        self._stop.set()
        with contextlib.suppress(Exception):
            await self.directory.leave.remote(self.replica_id)
        for task in (self._reporter, self._life):
            with contextlib.suppress(BaseException):
                await task
