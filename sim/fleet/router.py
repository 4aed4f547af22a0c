"""Ray Serve's request routing, as the fleet's router model decides it.

It follows ``PowerOfTwoChoicesRequestRouter`` (Ray,
``python/ray/serve/_private/request_router/pow_2_router.py``) and the
``MultiplexMixin`` and backoff of ``request_router.py`` beside it:

* **candidates** (``apply_multiplex_routing``): while a request is younger
  than the multiplexed matching timeout (drawn uniformly in [t, 2t] at every
  call, ``RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S`` = 1 s), the
  replicas that have its model loaded; if none has it (and the model is not
  already in the fallback set), or on every attempt after the first, the
  replicas with the fewest models loaded. After the timeout: the fewest-models
  replicas once, then every replica.
* **two choices** (``choose_replicas``): one candidate as is, two in a random
  order, otherwise two distinct ones drawn uniformly.
* **select** (``_select_from_candidate_replicas``): among the chosen replicas
  whose ongoing requests are below ``max_ongoing_requests``, the one with the
  fewest (the first on a tie); none: back-pressure, try again.
* **backoff** (``_choose_replicas_with_backoff``): the first retry is
  immediate, then sleeps of ``initial * multiplier**k`` capped at the maximum
  (0.025, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5 ... s).
* **max_queued_requests**: a request that arrives while that many wait for a
  replica is refused at once (Ray's ``BackPressureError``, HTTP 503).
* **busy retries** (voxpool's ingress, not Ray): see :meth:`Router.pick`.

The router sees exact queue lengths (one router; Ray's probes and cache
staleness are not modelled). Every random draw comes from the router's own
seeded generator, and replica ids are ordered integers, never set order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from sim.fleet.workload import RouterSettings


@attrs.define
class RoutingContext:
    """What routing one request remembers between attempts (Ray's ``routing_context``)."""

    started: float
    tried_first: bool = False
    tried_fewest: bool = False
    backoff_entered: bool = False
    backoffs: int = 0


class Router:
    """The router's view of the fleet (routable replicas, their ongoing requests and loaded
    models) and its decisions."""

    def __init__(self, settings: RouterSettings, max_ongoing: int, rng: random.Random) -> None:
        self.settings = settings
        self.max_ongoing = max_ongoing
        self.rng = rng
        self.routable: list[int] = []  # sorted replica ids
        self.ongoing: dict[int, int] = {}
        self.loaded: dict[int, tuple[str, ...]] = {}
        self.by_model: dict[str, list[int]] = {}  # model -> sorted replica ids that have it
        self.fallback_match: set[str] = set()
        self.queued = 0
        self._fewest: list[int] | None = None  # cached until a replica or its models change

    # ---------------------------------------------------------------- view
    def add(self, replica: int) -> None:
        """A replica became routable (started)."""
        if replica not in self.ongoing:
            self.routable.append(replica)
            self.routable.sort()
            self.ongoing[replica] = 0
            self.loaded[replica] = ()
            self._fewest = None

    def remove(self, replica: int) -> None:
        """A replica stops taking requests (it died or is draining)."""
        if replica in self.ongoing:
            self.routable.remove(replica)
            del self.ongoing[replica]
            self.set_loaded(replica, ())
            del self.loaded[replica]
            self._fewest = None

    def set_loaded(self, replica: int, models: tuple[str, ...]) -> None:
        """The models a routable replica reports loaded (Ray: multiplexed model ids pushed by the
        replica when they change)."""
        if replica not in self.loaded:
            return
        old = self.loaded[replica]
        if old == models:
            return
        self.loaded[replica] = models
        self._fewest = None
        for m in old:
            if m not in models:
                self.by_model[m].remove(replica)
        for m in models:
            if m not in old:
                ids = self.by_model.setdefault(m, [])
                ids.append(replica)
                ids.sort()

    def sent(self, replica: int) -> None:
        self.ongoing[replica] += 1

    def done(self, replica: int) -> None:
        if replica in self.ongoing:
            self.ongoing[replica] -= 1

    # ----------------------------------------------------------- decisions
    def admit(self) -> bool:
        """Whether a new request may queue for a replica (False: 503, back-pressure)."""
        cap = self.settings.max_queued_requests
        return cap is None or self.queued < cap

    def fewest_models(self) -> list[int]:
        """Routable replicas with the fewest models loaded (Ray's
        ``_get_replica_ids_with_fewest_multiplexed_models``)."""
        if self._fewest is None:
            if not self.routable:
                return []
            least = min(len(self.loaded[r]) for r in self.routable)
            self._fewest = [r for r in self.routable if len(self.loaded[r]) == least]
        return self._fewest

    def candidates(self, model: str, ctx: RoutingContext, now: float) -> list[int]:
        """The replicas one routing attempt may choose from (Ray's ``apply_multiplex_routing``)."""
        timeout = self.settings.multiplex_timeout_s
        if now - ctx.started < self.rng.uniform(timeout, 2 * timeout):
            have = self.by_model.get(model, [])
            if (not have and model not in self.fallback_match) or ctx.tried_first:
                out = self.fewest_models()
                self.fallback_match.add(model)
            else:
                if have:
                    self.fallback_match.discard(model)
                out = list(have)
            ctx.tried_first = True
            return out
        if not ctx.tried_fewest:
            ctx.tried_fewest = True
            return self.fewest_models()
        return list(self.routable)

    def two_choices(self, candidates: Sequence[int]) -> list[int]:
        """Power of two choices: at most two candidates, drawn at random (Ray's
        ``choose_replicas``)."""
        n = len(candidates)
        if n <= 1:
            return list(candidates)
        if n == 2:
            a, b = candidates
            return [a, b] if self.rng.getrandbits(1) else [b, a]
        i = self.rng.randrange(n)
        j = self.rng.randrange(n - 1)
        if j >= i:
            j += 1
        return [candidates[i], candidates[j]]

    def select(self, chosen: Sequence[int]) -> int | None:
        """The chosen replica with the fewest ongoing requests below ``max_ongoing_requests``
        (the first on a tie), or None when both are full (Ray's
        ``_select_from_candidate_replicas``)."""
        best: int | None = None
        lowest = self.max_ongoing
        for r in chosen:
            q = self.ongoing[r]
            if q < lowest:
                best, lowest = r, q
        return best

    def pick(
        self, model: str, ctx: RoutingContext, now: float, avoid: Sequence[int] = ()
    ) -> int | None:
        """One routing attempt: candidates, two choices, select. ``avoid``: replicas that
        already answered this request busy. As voxpool's Ray deployment routes a retry
        (``server.ray.routing.AvoidingRouter``, not Ray's own): Ray's two choices without
        the avoided replicas; if that leaves none, two others drawn from every running
        replica; if every replica is avoided, Ray's choice as it was."""
        chosen = self.two_choices(self.candidates(model, ctx, now))
        if avoid:
            kept = [r for r in chosen if r not in avoid]
            if not kept:
                others = [r for r in self.routable if r not in avoid]
                kept = self.two_choices(others) if others else chosen
            chosen = kept
        return self.select(chosen)

    def backoff(self, ctx: RoutingContext) -> float:
        """How long to wait before the next attempt after a failed one (0: at once)."""
        if not ctx.backoff_entered:
            ctx.backoff_entered = True
            return 0.0
        s = self.settings
        delay = min(s.backoff_initial_s * s.backoff_multiplier**ctx.backoffs, s.backoff_max_s)
        ctx.backoffs += 1
        return delay
