"""``voxpool ray serve`` and ``voxpool ray config``: voxpool on Ray Serve.

``serve`` starts a local Ray instance (or joins one with ``--address``),
deploys the application of :mod:`server.ray.app` on the config's host and
port, and serves until SIGINT/SIGTERM; then it deletes the application (Ray
drains every replica's requests for up to ``shutdown_timeout_s``) and exits 0.

``config`` writes a Ray Serve config file for ``serve deploy`` on a running
cluster, or with ``--kuberay`` a KubeRay ``RayService`` manifest carrying the
same config. The voxpool config is inlined into it, so the cluster needs no
file of ours; model paths and audio roots in it must then be absolute (the
same on every node, e.g. in the container image).

Both need the ``ray`` extra (``pip install 'voxpool[ray]'``); docs/scale-out.md
shows them end to end.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from server.config import ConfigError, parse_json, read_config_text

RAY_MISSING = "voxpool ray: Ray Serve is not installed (pip install 'voxpool[ray]')"


def add_parser(sub: Any) -> None:
    """The ``ray`` subcommand and its two actions."""
    ray_cmd = sub.add_parser("ray", help="run on Ray Serve (extra 'ray'): serve, or write a config")
    actions = ray_cmd.add_subparsers(dest="ray_command", required=True)
    serve = actions.add_parser("serve", help="deploy on a local or existing Ray cluster and serve")
    config = actions.add_parser("config", help="write a Ray Serve (or KubeRay) config file")
    for p in (serve, config):
        p.add_argument("--config", help="audio.cpp server.json (default: the embedded default)")
        p.add_argument("--replicas", type=int, help="fixed model replicas (default: autoscale)")
        p.add_argument("--min-replicas", type=int, default=1)
        p.add_argument("--max-replicas", type=int, default=4)
        p.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs per model replica")
        p.add_argument("--name", default="voxpool", help="the Serve application's name")
    serve.add_argument("--address", help="a Ray cluster to join (default: start a local one)")
    serve.add_argument("--host", help="HTTP host (default: the config's)")
    serve.add_argument("--port", type=int, help="HTTP port (default: the config's)")
    config.add_argument("--kuberay", action="store_true", help="a KubeRay RayService manifest")
    config.add_argument("--image", default="voxpool:latest", help="container image (--kuberay)")
    config.add_argument("-o", "--output", help="write here (default: stdout)")


def ray_args(args: argparse.Namespace, inline: bool) -> dict[str, Any]:
    """The application's ``args`` (server.ray.app.RayArgs) from the command line.

    ``inline`` puts the config file's contents in, not its path.
    """
    out: dict[str, Any] = {
        "min_replicas": args.min_replicas,
        "max_replicas": args.max_replicas,
        "replica_cpus": args.replica_cpus,
        "name": args.name,
    }
    if args.replicas is not None:
        out["replicas"] = args.replicas
    if args.config:
        out["config"] = inline_config(args.config) if inline else str(Path(args.config).resolve())
    return out


def inline_config(path: str) -> dict[str, Any]:
    """A server.json's object, checked: it must parse, and its paths must be absolute."""
    raw = parse_json(read_config_text(path))
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a JSON object")
    paths = [m.get("path", "") for m in raw.get("models", []) if isinstance(m, dict)]
    paths += list(raw.get("audio_roots", []))
    relative = [p for p in paths if isinstance(p, str) and p and not Path(p).is_absolute()]
    if relative:
        raise ConfigError(
            f"paths in a config sent to a cluster must be absolute (on every node): {relative}"
        )
    return raw


def serve_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Ray Serve config file (``serve deploy``) for these arguments."""
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "applications": [
            {
                "name": args.name,
                "route_prefix": "/",
                "import_path": "server.ray.app:build",
                "args": ray_args(args, inline=True),
            }
        ],
    }


def kuberay_manifest(args: argparse.Namespace) -> dict[str, Any]:
    """A KubeRay ``RayService`` running :func:`serve_config` on the image ``args.image``."""
    import ray
    import yaml

    def container(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "image": args.image,
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
        }

    head = container("ray-head")
    head["ports"] = [
        {"containerPort": 6379, "name": "gcs"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 8000, "name": "serve"},
    ]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": args.name},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config(args), sort_keys=False),
            "rayClusterConfig": {
                "rayVersion": ray.__version__,
                "enableInTreeAutoscaling": args.replicas is None,
                "headGroupSpec": {
                    "rayStartParams": {"dashboard-host": "0.0.0.0"},
                    "template": {"spec": {"containers": [head]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "voxpool",
                        "replicas": args.replicas or args.min_replicas,
                        "minReplicas": args.replicas or args.min_replicas,
                        "maxReplicas": args.replicas or args.max_replicas,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [container("ray-worker")]}},
                    }
                ],
            },
        },
    }


def dump_yaml(document: dict[str, Any]) -> str:
    """``document`` as YAML, multi-line strings (the RayService's Serve config) as blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return str(yaml.dump(document, Dumper=Dumper, sort_keys=False))


def write_config(args: argparse.Namespace) -> int:
    document = kuberay_manifest(args) if args.kuberay else serve_config(args)
    text = dump_yaml(document)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    """Deploy, serve until a signal, then delete the application (draining) and stop."""
    import ray
    from ray import serve

    from server.ray.app import RayArgs, build
    from server.ray.directory import end_directory

    rargs = RayArgs.from_mapping(ray_args(args, inline=False))
    config = rargs.server_config()
    host = args.host or config.host
    port = args.port if args.port is not None else config.port
    stop = threading.Event()
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build(rargs), name=rargs.name, route_prefix="/")
        print(f"voxpool: serving on Ray at http://{host}:{port}", file=sys.stderr, flush=True)
        stop.wait()
        print("voxpool: shutting down (draining the replicas)", file=sys.stderr, flush=True)
        serve.delete(rargs.name)
        end_directory(rargs.name)
        serve.shutdown()
    finally:
        ray.shutdown()
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        import ray  # noqa: F401
    except ImportError:
        print(RAY_MISSING, file=sys.stderr)
        return 2
    try:
        return write_config(args) if args.ray_command == "config" else run_serve(args)
    except ConfigError as exc:
        print(f"voxpool ray: {exc}", file=sys.stderr)
        return 2


__all__ = ["add_parser", "inline_config", "kuberay_manifest", "main", "serve_config"]
