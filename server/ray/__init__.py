"""voxpool on Ray Serve (the ``ray`` extra): an ingress and model replicas running the runtime.

:mod:`server.ray.app` builds the application; :mod:`server.ray.ingress` is the
HTTP front, :mod:`server.ray.replica` the model deployment,
:mod:`server.ray.exchange` what travels between them,
:mod:`server.ray.directory` the fleet-wide views and :mod:`server.ray.multiplex`
keeps Ray's model affinity equal to the runtime's residency. docs/scale-out.md
shows how to run it.
"""
