"""Ray Serve's default autoscaling policy, ticked by the fleet's controller loop.

It follows ``replica_queue_length_autoscaling_policy`` and
``_calculate_desired_num_replicas`` (Ray, ``python/ray/serve/autoscaling_policy.py``):

* the metric is the total of ongoing requests (at replicas, plus those queued at
  the router: Ray collects them at the handle), averaged over
  ``look_back_period_s``;
* desired = ceil(running * (1 + (error - 1) * factor)) with error =
  total / (target_ongoing_requests * running) and the upscaling or
  downscaling factor; an error of 0 steps one replica down; clamped to
  [min_replicas, max_replicas]; with no running replica and traffic waiting,
  scale to at least one;
* a decision to go up (down) must repeat for more than
  ``upscale_delay_s / interval_s`` (``downscale_delay_s / interval_s``)
  consecutive ticks before the target changes; a tick that wants neither
  resets the count.

The controller starts new replicas (each takes ``start_time_s`` to start) and
stops surplus ones (those still starting first, then the newest running one;
a stopped replica drains its ongoing requests before it goes). Ray ranks
replicas to stop by node; with one node per replica here, newest-first is the
simplification.
"""

from __future__ import annotations

import collections
import math

import attrs

from sim.fleet.workload import AutoscalingSettings


def desired_replicas(config: AutoscalingSettings, total_requests: float, running: int) -> int:
    """How many replicas the load asks for (Ray's ``_calculate_desired_num_replicas``)."""
    if running <= 0:
        raise ValueError("the number of running replicas cannot be zero")
    error = total_requests / (config.target_ongoing_requests * running)
    factor = config.upscaling_factor if error >= 1 else config.downscaling_factor
    desired = math.ceil(running * (1 + (error - 1) * factor))
    if error == 0 and desired == running and desired >= 1:
        desired -= 1
    return max(config.min_replicas, min(config.max_replicas, desired))


@attrs.define
class Autoscaler:
    """The policy's state across ticks: the metric window and the decision counter."""

    config: AutoscalingSettings
    target: int
    counter: int = 0
    window: collections.deque[tuple[float, float]] = attrs.field(factory=collections.deque)
    window_sum: float = 0.0

    def observe(self, now: float, total_requests: float) -> float:
        """Add one sample; the average over the look-back window."""
        window = self.window
        window.append((now, total_requests))
        self.window_sum += total_requests
        horizon = now - self.config.look_back_period_s
        while window and window[0][0] < horizon:
            self.window_sum -= window.popleft()[1]
        return self.window_sum / len(window)

    def decide(self, total_requests: float, running: int) -> int:
        """One tick of the policy: the new target number of replicas (Ray's
        ``replica_queue_length_autoscaling_policy``)."""
        cfg = self.config
        if running == 0:
            if total_requests > 0:
                self.target = max(math.ceil(1 * cfg.upscaling_factor), self.target)
            return self.target
        desired = desired_replicas(cfg, total_requests, running)
        if desired > self.target:
            self.counter = max(self.counter, 0) + 1
            if self.counter > int(cfg.upscale_delay_s / cfg.interval_s):
                self.counter = 0
                self.target = desired
        elif desired < self.target:
            self.counter = min(self.counter, 0) - 1
            if self.counter < -int(cfg.downscale_delay_s / cfg.interval_s):
                self.counter = 0
                self.target = desired
        else:
            self.counter = 0
        return self.target
