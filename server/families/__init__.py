"""Model families: one registry entry per family (:mod:`server.families.registry`).

- :mod:`~server.families.base`: the typed :class:`~server.families.base.Family` entry and the
  protocols its parts implement (HTTP adapter, validation plan);
- :mod:`~server.families.registry`: the one table every consumer reads;
- ``<family>.py``: a family's entry (with its validation plan and bench workload),
  ``<family>_http.py``: its HTTP adapter, loaded only by the HTTP layer;
- :mod:`~server.families.http`: the field ranges and helpers the adapters share;
  :mod:`~server.families.data`: the fixtures plans and benches read.

This package's ``__init__`` imports nothing, so the configuration can read the
registry without the HTTP framework.
"""
