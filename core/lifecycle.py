"""The lifecycle of one registered model (reference §4.2-4.6).

States: unloaded, loading, ready, reconfiguring, unloading. Only a lease holder
drives transitions: a request lease holder may start the first load; a
management lease holder unloads and reconfigures. The rules:

* one initializer per first load: the first lease holder to find the model
  unloaded loads it; every other holder waits for that load, then shares the pool;
* only a complete pool is published; a failed load returns to unloaded and the
  next waiting holder (if any) becomes the initializer and retries;
* unloading clears logical residency *before* the teardown finishes, so a
  retiring model never counts against residency limits or blocks a new load;
* reconfiguration validates (and probes capacity) before teardown: a pre-commit
  failure keeps the old working pool; after commit the old pool is torn down and
  the new configuration loaded, and a post-commit failure leaves the new
  configuration registered but unloaded.
"""

from __future__ import annotations

import enum

import attrs

from core.events import Reason


class ModelState(enum.Enum):
    """Where one model is in its lifecycle."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    RECONFIGURING = "reconfiguring"
    UNLOADING = "unloading"


RESIDENT_STATES = frozenset({ModelState.LOADING, ModelState.READY, ModelState.RECONFIGURING})
"""States that count as logically resident (a model being torn down does not)."""


@attrs.frozen
class Proceed:
    """The pool of ``generation`` is published: run on it."""

    generation: int


@attrs.frozen
class StartLoad:
    """``ticket`` is the initializer: load the pool of ``generation`` and report the outcome."""

    ticket: int
    generation: int


@attrs.frozen
class WaitLoad:
    """Another holder is loading; wait for :class:`LoadOutcome`."""

    initializer: int


@attrs.frozen
class Teardown:
    """Destroy the published pool of ``generation`` (clones, then primary, then weights)."""

    generation: int


@attrs.frozen
class Nothing:
    """No work: e.g. unloading a model that is already unloaded (idempotent)."""

    reason: Reason


@attrs.frozen
class LoadOutcome:
    """The end of one load: who may proceed, and who (if anyone) must retry as the new
    initializer."""

    published: bool
    proceed: tuple[int, ...] = ()
    retry: StartLoad | None = None


class Left(enum.Enum):
    """What a departing load waiter was when it left (see :meth:`Lifecycle.abandon_wait`)."""

    WAITER = "waiter"
    """It was waiting for another holder's load: it just stops waiting."""
    INITIALIZER = "initializer"
    """A failed or refused load had named it the next initializer: the role passes on."""
    NOTHING = "nothing"
    """It was neither (the load it waited for already published): nothing to do."""


@attrs.frozen
class Abandoned:
    """A waiter left: what it was, and who (if anyone) must now load in its place."""

    left: Left
    retry: StartLoad | None = None


class LifecycleError(RuntimeError):
    """A transition asked for in a state that does not allow it (a runtime bug)."""


@attrs.define
class Lifecycle:
    """The state of one model's pool and the rules for changing it."""

    model: str
    generation: int = 0
    state: ModelState = ModelState.UNLOADED
    pool_generation: int | None = None
    initializer: int | None = None
    load_waiters: list[int] = attrs.field(factory=list)
    loads_started: int = 0
    loads_published: int = 0
    teardowns: int = 0
    _before_reconfigure: ModelState | None = None

    @property
    def resident(self) -> bool:
        """Logically resident: counted by residency limits and memory budgets."""
        return self.state in RESIDENT_STATES

    @property
    def loaded(self) -> bool:
        """A complete pool is published (``loaded`` in ``/v1/models``)."""
        return self.state in (ModelState.READY, ModelState.RECONFIGURING)

    # ---------------------------------------------------------------- loading
    def ensure_loaded(self, ticket: int) -> Proceed | StartLoad | WaitLoad:
        """A lease holder needs the pool: run on it, load it (first holder), or wait for the
        load."""
        if self.state is ModelState.READY:
            return Proceed(self.generation)
        if self.state is ModelState.UNLOADED:
            return self._start(ticket)
        if self.state is ModelState.LOADING:
            if ticket == self.initializer:
                raise LifecycleError(f"ticket {ticket} is already loading '{self.model}'")
            self.load_waiters.append(ticket)
            assert self.initializer is not None
            return WaitLoad(self.initializer)
        raise LifecycleError(f"cannot load '{self.model}' while {self.state.value}")

    def load_succeeded(self, ticket: int) -> LoadOutcome:
        """The initializer published a complete pool: every waiter proceeds on it."""
        self._check_initializer(ticket)
        self.state = ModelState.READY
        self.pool_generation = self.generation
        self.initializer = None
        self.loads_published += 1
        waiters, self.load_waiters = tuple(self.load_waiters), []
        return LoadOutcome(True, proceed=waiters)

    def load_failed(self, ticket: int) -> LoadOutcome:
        """The load failed and published nothing: back to unloaded, next waiter retries."""
        self._check_initializer(ticket)
        self.state = ModelState.UNLOADED
        self.initializer = None
        if self.load_waiters:
            return LoadOutcome(False, retry=self._start(self.load_waiters.pop(0)))
        return LoadOutcome(False)

    def abandon_wait(self, ticket: int) -> Abandoned:
        """A holder that waited for a load went away (disconnect) before it began loading.

        If it is still waiting it just leaves the wait list. If a failed or
        refused load already named it the next initializer (the failure and its
        departure landed together), the role passes on: the next waiter becomes
        the initializer, or, with none left, the model returns to unloaded. A
        departing holder never leaves the model in ``loading`` with nobody
        loading it (race report 2). Only a holder that has not begun its load
        may call this.
        """
        if ticket in self.load_waiters:
            self.load_waiters.remove(ticket)
            return Abandoned(Left.WAITER)
        if self.state is not ModelState.LOADING or ticket != self.initializer:
            return Abandoned(Left.NOTHING)
        self.state = ModelState.UNLOADED
        self.initializer = None
        self.loads_started -= 1  # it was named, never started
        if self.load_waiters:
            return Abandoned(Left.INITIALIZER, retry=self._start(self.load_waiters.pop(0)))
        return Abandoned(Left.INITIALIZER)

    # ---------------------------------------------------------- management
    def begin_unload(self) -> Teardown | Nothing:
        """Under the exclusive lease: retire the pool (logically non-resident from now on)."""
        if self.state is ModelState.UNLOADED:
            return Nothing(Reason.ALREADY_UNLOADED)
        if self.state not in (ModelState.READY, ModelState.RECONFIGURING):
            raise LifecycleError(f"cannot unload '{self.model}' while {self.state.value}")
        assert self.pool_generation is not None
        self.state = ModelState.UNLOADING
        return Teardown(self.pool_generation)

    def unload_finished(self) -> None:
        """The teardown is complete: the model is unloaded."""
        if self.state is not ModelState.UNLOADING:
            raise LifecycleError(f"'{self.model}' is not unloading")
        self.state = ModelState.UNLOADED
        self.pool_generation = None
        self.teardowns += 1

    def begin_reconfigure(self) -> None:
        """Under the exclusive lease: start validating a new configuration; the old pool stays."""
        if self.state not in (ModelState.READY, ModelState.UNLOADED):
            raise LifecycleError(f"cannot reconfigure '{self.model}' while {self.state.value}")
        self._before_reconfigure = self.state
        self.state = ModelState.RECONFIGURING if self.state is ModelState.READY else self.state

    def reject_reconfigure(self) -> None:
        """Pre-commit failure (invalid config, capacity probe): keep the old pool as it was."""
        if self._before_reconfigure is None:
            raise LifecycleError(f"'{self.model}' is not reconfiguring")
        self.state = self._before_reconfigure
        self._before_reconfigure = None

    def commit_reconfigure(self, generation: int) -> Teardown | Nothing:
        """Commit ``generation`` (the admission's new one): the old pool, if any, is torn down
        first."""
        if self._before_reconfigure is None:
            raise LifecycleError(f"'{self.model}' is not reconfiguring")
        if generation <= self.generation:
            raise LifecycleError("a reconfiguration must start a newer generation")
        self._before_reconfigure = None
        self.generation = generation
        if self.state is ModelState.RECONFIGURING:
            assert self.pool_generation is not None
            self.state = ModelState.UNLOADING
            return Teardown(self.pool_generation)
        return Nothing(Reason.ALREADY_UNLOADED)

    # --------------------------------------------------------------- internal
    def _start(self, ticket: int) -> StartLoad:
        self.state = ModelState.LOADING
        self.initializer = ticket
        self.loads_started += 1
        return StartLoad(ticket, self.generation)

    def _check_initializer(self, ticket: int) -> None:
        if self.state is not ModelState.LOADING or ticket != self.initializer:
            raise LifecycleError(f"ticket {ticket} is not the initializer of '{self.model}'")
