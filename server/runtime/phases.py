"""Where one request's time went: queued, loading, running (the ``Server-Timing`` header).

The runtime fills a :class:`Phases` in as the request passes each point, on its
own clock (virtual under the simulator); the HTTP layer turns it into the W3C
``Server-Timing`` header and the JSON ``timing`` fields. Operators see how long a
request waited for a slot apart from how long its model worked, and the fleet
benchmark takes the model's service times from it.
"""

from __future__ import annotations

import attrs


@attrs.define
class Phases:
    """The instants one request passed, on the runtime's clock (``None``: not reached).

    ``requested``: it asked for a lease; ``admitted``: the lease was granted (the
    queue is behind it); ``ready``: its session was ready (a first load, or the
    wait for another request's load, is behind it); ``finished``: the model's work
    ended (success or error).
    """

    requested: float | None = None
    admitted: float | None = None
    ready: float | None = None
    finished: float | None = None

    def durations_ms(self) -> dict[str, float]:
        """``queue``, ``load`` and ``run`` in milliseconds, each only once both its ends
        were reached (a request refused while queued has none)."""
        points = (
            ("queue", self.requested, self.admitted),
            ("load", self.admitted, self.ready),
            ("run", self.ready, self.finished),
        )
        return {
            name: round((end - start) * 1000.0, 3)
            for name, start, end in points
            if start is not None and end is not None
        }

    def server_timing(self) -> str:
        """The ``Server-Timing`` header's value: ``queue;dur=1.5, load;dur=0, run;dur=412.25``,
        each duration exactly as :meth:`durations_ms` gives it (to the microsecond)."""
        return ", ".join(f"{name};dur={_millis(ms)}" for name, ms in self.durations_ms().items())


def _millis(ms: float) -> str:
    """``ms`` with its three decimals and no trailing zeros (``2000``, ``1039.078``): the
    ``g`` format kept six significant digits, so a phase of a second or more lost some."""
    return f"{ms:.3f}".rstrip("0").rstrip(".")
