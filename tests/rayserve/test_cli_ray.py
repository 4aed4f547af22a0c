"""``voxpool ray config`` (checked by Ray Serve's own schema) and ``voxpool ray serve`` as a
user runs it: a process that deploys, serves, and drains on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.ci import skip_or_fail
from tests.server.live import ROOT, free_port
from tests.test_cli_run import voxpool

try:
    from ray.serve.schema import ServeDeploySchema
except ImportError:  # pragma: no cover - the test extra installs ray
    skip_or_fail("ray is not installed", needs="the ray extra", module_level=True)

FLEET = ROOT / "tests" / "data" / "ray" / "fleet.json"
VOXPOOL_RAY_SERVE = (sys.executable, "-m", "server.cli", "ray", "serve", "--replicas", "1")
VOXPOOL_RAY_SERVE += ("--replica-cpus", "0")  # the test cluster is 2 CPUs with other work on it


def test_the_serve_config_is_valid_for_serve_deploy_and_inlines_the_voxpool_config() -> None:
    done = voxpool("ray", "config", "--config", str(FLEET), "--replicas", "3")
    assert done.returncode == 0, done.stderr
    document = yaml.safe_load(done.stdout)
    schema = ServeDeploySchema.model_validate(document)
    app = schema.applications[0]
    assert (app.import_path, app.route_prefix) == ("server.ray.app:build", "/")
    assert app.args["replicas"] == 3
    assert app.args["config"] == json.loads(FLEET.read_text())


def test_the_built_application_takes_its_numbers_from_the_voxpool_config() -> None:
    from server.ray.app import MODELS, RayArgs, build, limits

    args = RayArgs(config=json.loads(FLEET.read_text()), min_replicas=2, max_replicas=5)
    bounds = limits(args.server_config())
    # three models of one slot and a queue of 2 each
    assert (bounds.max_ongoing_requests, bounds.target_ongoing_requests) == (9, 3)
    app = build(args)
    models = app._bound_deployment.init_args[0]._bound_deployment  # the model deployment
    assert models.name == MODELS
    assert models.max_ongoing_requests == 9
    scaling = models._deployment_config.autoscaling_config
    bounds_seen = (scaling.min_replicas, scaling.max_replicas, scaling.target_ongoing_requests)
    assert bounds_seen == (2, 5, 3)


def test_a_kuberay_manifest_carries_the_same_serve_config(tmp_path: Path) -> None:
    out = tmp_path / "rayservice.yaml"
    done = voxpool("ray", "config", "--kuberay", "--image", "me/voxpool:1", "-o", str(out))
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(out.read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    cluster = manifest["spec"]["rayClusterConfig"]
    images = [cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]]
    images += [g["template"]["spec"]["containers"][0]["image"] for g in cluster["workerGroupSpecs"]]
    assert images == ["me/voxpool:1", "me/voxpool:1"]


def test_a_config_with_relative_paths_is_refused_for_a_cluster(tmp_path: Path) -> None:
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"models": [], "ui_management": True, "audio_roots": ["a"]}))
    done = voxpool("ray", "config", "--config", str(config))
    assert done.returncode == 2
    assert "must be absolute" in done.stderr and "['a']" in done.stderr


def test_voxpool_ray_serve_deploys_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "ray-serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*VOXPOOL_RAY_SERVE, "--config", str(FLEET), "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=5).json().get("replicas") == 1:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        r = httpx.post(
            url + "/v1/audio/speech", json={"model": "piper", "input": "Hi."}, timeout=300
        )
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=5)
    assert "shutting down (draining the replicas)" in log.read_text()
