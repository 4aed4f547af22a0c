"""The fleet simulator: many replicas, the real runtime in each, behind a Ray Serve router model.

One concept per module: :mod:`sim.fleet.workload` (the TOML format),
:mod:`sim.fleet.arrivals` (the request stream), :mod:`sim.fleet.router` (Ray Serve's
request routing), :mod:`sim.fleet.autoscaler` (Ray Serve's default autoscaling policy),
:mod:`sim.fleet.replica` (one replica: a real ``Runtime`` with fake sessions),
:mod:`sim.fleet.run` (the fleet under one virtual clock), :mod:`sim.fleet.stats`
(what the run measured) and :mod:`sim.fleet.report` (the table and the picture).
"""
