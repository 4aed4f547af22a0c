"""The Ray Serve application: an ingress and a model deployment, built from a voxpool config.

:func:`build` is the one builder: ``voxpool ray serve`` runs what it returns,
and the config file that ``voxpool ray config`` writes names it
(``import_path: server.ray.app:build``) for ``serve deploy`` or a KubeRay
``RayService``. Its arguments (:class:`RayArgs`) say where the voxpool config
is and how many replicas to run.

The numbers Ray routes and scales by come from the voxpool config
(:func:`limits`): a replica takes at most its models' slots plus their queue
bounds (``max_ongoing_requests``), and the autoscaler aims at every slot busy
(``target_ongoing_requests``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from core.policy import RuntimeKind, ongoing_bounds, select_runtime
from server.config import ConfigError, ServerConfig, embedded_default, load_config, parse_config
from server.ray.ingress import VoxpoolIngress
from server.ray.replica import VoxpoolReplica
from server.ray.routing import ROUTER_PATH

INGRESS = "VoxpoolIngress"
MODELS = "VoxpoolModels"
"""The two deployments' names."""


@attrs.frozen
class RayArgs:
    """What :func:`build` takes (the ``args`` of a Serve config file)."""

    config: str | Mapping[str, Any] | None = None
    """A server.json path (readable where the app is built), an inline config object,
    or None for the embedded default."""
    parallel_jobs: bool = True
    replicas: int | None = None
    """A fixed number of model replicas; None: autoscale between the two bounds below."""
    min_replicas: int = 1
    max_replicas: int = 4
    replica_cpus: float = 1.0
    """CPUs Ray reserves for each model replica (0 on a small test cluster)."""
    retries: int = 2
    """How many more replicas the ingress tries after a busy or lost one."""
    name: str = "voxpool"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RayArgs:
        """Parse a Serve config's ``args``; unknown keys are a :class:`ConfigError`."""
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown voxpool Ray arguments: {unknown}")
        return cls(**dict(raw))

    def server_config(self) -> ServerConfig:
        """The voxpool config these arguments name."""
        runtime = select_runtime(self.parallel_jobs)
        if self.config is None:
            return embedded_default(runtime)
        if isinstance(self.config, str):
            return load_config(self.config, runtime=runtime)
        return parse_config(self.config, runtime=runtime)


@attrs.frozen
class Limits:
    """Per-replica request bounds Ray uses for routing, back-pressure and autoscaling."""

    max_ongoing_requests: int
    target_ongoing_requests: int


def limits(config: ServerConfig) -> Limits:
    """A replica's bounds from its config (core.policy.ongoing_bounds over its models'
    slots: one each on the original, serial runtime)."""
    serial = config.runtime is RuntimeKind.ORIGINAL
    slots = [1 if serial else model.slots for model in config.models] or [1]
    held, target = ongoing_bounds(slots, config.max_queue)
    return Limits(max_ongoing_requests=held, target_ongoing_requests=target)


def deployment_options(args: RayArgs, config: ServerConfig) -> dict[str, Any]:
    """The model deployment's Ray Serve options."""
    bounds = limits(config)
    scaling: dict[str, Any] = (
        {"num_replicas": args.replicas}
        if args.replicas is not None
        else {
            "autoscaling_config": {
                "min_replicas": args.min_replicas,
                "max_replicas": args.max_replicas,
                "target_ongoing_requests": bounds.target_ongoing_requests,
            }
        }
    )
    return {
        **scaling,
        "request_router_config": RequestRouterConfig(request_router_class=ROUTER_PATH),
        "max_ongoing_requests": bounds.max_ongoing_requests,
        "graceful_shutdown_timeout_s": config.shutdown_timeout_s,
        "ray_actor_options": {"num_cpus": args.replica_cpus},
    }


def build(raw: Mapping[str, Any] | RayArgs | None = None) -> Application:
    """The application for ``raw`` (a Serve config's ``args``, or :class:`RayArgs`)."""
    args = raw if isinstance(raw, RayArgs) else RayArgs.from_mapping(raw or {})
    config = args.server_config()
    models = serve.deployment(name=MODELS, **deployment_options(args, config))(VoxpoolReplica)
    ingress = serve.deployment(
        name=INGRESS,
        max_ongoing_requests=max(1000, 4 * limits(config).max_ongoing_requests),
        ray_actor_options={"num_cpus": 0},
    )(serve.ingress()(VoxpoolIngress))
    return ingress.bind(models.bind(config, args.name), config, args.name, args.retries)
