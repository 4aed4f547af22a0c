"""OpenCL device probing and selection, and the startup errors of serve/run without a device.

A machine whose OpenCL platforms list devices that cannot build kernels (the pip
wheels' PoCL on AMD Zen 5: "unknown target CPU 'generic'") is simulated with
fake devices and a failing build probe, so these tests run on any machine with
pyopencl installed, whatever its devices.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs
import pytest

from tests.backends import opencl_device

cl = opencl_device.import_pyopencl()

import backends.opencl.devices as cldev  # noqa: E402
from backends.opencl_backend import (  # noqa: E402
    OpenCLUnavailable,
    check_device,
    make_backend,
    probe,
    working_devices,
)
from server import cli  # noqa: E402
from server.provider import BackendUnavailable, check_backends  # noqa: E402
from server.runtime.ports import ModelSpec  # noqa: E402

# What pyopencl raises on Zen 5 with the pip wheels' PoCL 3.0 (LLVM 14).
ZEN5_ERROR = (
    "clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed: BUILD_PROGRAM_FAILURE\n"
    "\n"
    "Build on <pyopencl.Device 'pthread-AMD Ryzen 9 9950X' on 'Portable Computing Language' "
    "at 0x55d0>:\n"
    "\n"
    "error: unknown target CPU 'generic'\n"
    "Device pthread-AMD Ryzen 9 9950X failed to build the program, "
    "log: error: unknown target CPU 'generic'\n"
)
ZEN5_CAUSE = "error: unknown target CPU 'generic'"


@attrs.define(eq=False)
class FakePlatform:
    name: str
    version: str


@attrs.define(eq=False)
class FakeDevice:
    """What the probe reads from a ``pyopencl.Device``."""

    name: str
    platform: FakePlatform
    driver_version: str
    type: int
    int_ptr: int
    error: str | None = None
    """What the build probe raises on this device (``None``: it builds)."""


PIP_POCL = FakePlatform("Portable Computing Language", "OpenCL 3.0 PoCL 3.0-rc2 LLVM 14.0.6")
DEBIAN_POCL = FakePlatform("Portable Computing Language", "OpenCL 3.0 PoCL 3.1+debian LLVM 15.0.6")
_ptrs = itertools.count(1)
CPU = int(cl.device_type.CPU)
GPU = int(cl.device_type.GPU)


def fake(
    name: str, platform: FakePlatform, driver: str, kind: int, error: str | None
) -> FakeDevice:
    return FakeDevice(name, platform, driver, kind, int_ptr=next(_ptrs), error=error)


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[FakeDevice]]:
    """Replace the machine's devices: each argument is one platform's list of fake devices."""
    built: list[FakeDevice] = []

    def build_probe(device: FakeDevice) -> None:
        built.append(device)
        if device.error is not None:
            raise cl.RuntimeError(device.error)

    def setup(*platforms: list[FakeDevice]) -> list[FakeDevice]:
        found = [(p, d, dev) for p, devs in enumerate(platforms) for d, dev in enumerate(devs)]
        monkeypatch.setattr(cldev, "devices", lambda: found)
        return built

    monkeypatch.setattr(cldev, "build_probe", build_probe)
    monkeypatch.setattr(cldev, "_cache", {})
    return setup


def zen5_pip_cpu() -> FakeDevice:
    return fake("pthread-AMD Ryzen 9 9950X", PIP_POCL, "3.0-rc2", CPU, ZEN5_ERROR)


def debian_cpu() -> FakeDevice:
    return fake("pthread-znver5-AMD Ryzen 9 9950X", DEBIAN_POCL, "3.1+debian", CPU, None)


def test_default_device_falls_back_to_the_next_that_builds(install: Any) -> None:
    broken, works = zen5_pip_cpu(), debian_cpu()
    install([broken], [works])
    for spec in ("0", "", " 0 "):
        chosen = check_device(spec)
        assert chosen.device is works
        assert (chosen.spec, chosen.ok, chosen.cause) == ("1:0", True, "")
    assert check_device("cpu").device is works  # the first CPU device that works
    assert [r.device for r in working_devices()] == [works]
    failed = probe(cast(Any, broken))
    assert (failed.ok, failed.cause, failed.spec) == (False, ZEN5_CAUSE, "0:0")
    assert (failed.platform, failed.name, failed.driver) == (
        "Portable Computing Language",
        "pthread-AMD Ryzen 9 9950X",
        "3.0-rc2",
    )


def test_each_device_is_probed_once(install: Any) -> None:
    broken, works = zen5_pip_cpu(), debian_cpu()
    built = install([broken, works])
    for _ in range(3):
        assert check_device("0").device is works
    working_devices()
    assert built == [broken, works]
    cldev.clear_cache()
    check_device("0")
    assert built == [broken, works, broken, works]


def test_an_explicit_device_that_cannot_build_raises_clearly(install: Any) -> None:
    broken, works = zen5_pip_cpu(), debian_cpu()
    install([broken], [works])
    for spec in ("0:0", " 0 : 0 "):
        with pytest.raises(OpenCLUnavailable) as info:
            check_device(spec)
        message = str(info.value)
        assert f"configured device {spec.strip()!r}" in message
        assert "'pthread-AMD Ryzen 9 9950X'" in message and "3.0-rc2" in message
        assert ZEN5_CAUSE in message and "apt-get install pocl-opencl-icd" in message
    assert check_device("1:0").device is works  # an explicit device that works is used
    assert check_device("1").device is works  # one index over every device


def test_an_explicit_flat_index_that_cannot_build_raises(install: Any) -> None:
    works, broken = debian_cpu(), zen5_pip_cpu()
    install([works], [broken])
    with pytest.raises(OpenCLUnavailable, match=r"configured device '1'.*unknown target CPU"):
        check_device("1")
    with pytest.raises(ValueError, match="no device '2'; available: 0:0 pthread-znver5"):
        check_device("2")


def test_a_device_type_with_no_working_device_raises(install: Any) -> None:
    gpu = fake("Some GPU", FakePlatform("Vendor", "OpenCL 3.0 vendor"), "1.0", GPU, None)
    install([zen5_pip_cpu()], [gpu])
    assert check_device("gpu").device is gpu
    assert check_device("0").device is gpu
    with pytest.raises(OpenCLUnavailable, match="no CPU device can build OpenCL kernels"):
        check_device("cpu")


def test_no_working_device_names_every_device_the_cause_and_the_fix(install: Any) -> None:
    other = fake(
        "pthread-other",
        DEBIAN_POCL,
        "3.1+debian",
        CPU,
        "clCreateContext failed: OUT_OF_HOST_MEMORY",
    )
    install([zen5_pip_cpu()], [other])
    with pytest.raises(OpenCLUnavailable) as info:
        make_backend("0")
    message = str(info.value)
    assert "\n" not in message  # one line on stderr
    assert message.startswith("opencl: no device can build OpenCL kernels: tried 0:0 ")
    for text in (
        "'pthread-AMD Ryzen 9 9950X' on 'Portable Computing Language'",
        "PoCL 3.0-rc2 LLVM 14.0.6",
        ZEN5_CAUSE,
        "1:0 'pthread-other'",
        "PoCL 3.1+debian",
        "clCreateContext failed: OUT_OF_HOST_MEMORY",
        "sudo apt-get install pocl-opencl-icd",
    ):
        assert text in message
    assert isinstance(info.value, RuntimeError)


def test_no_device_at_all(install: Any) -> None:
    install()
    with pytest.raises(OpenCLUnavailable, match=r"no OpenCL device found.*pocl-opencl-icd"):
        check_device("0")
    assert working_devices() == []


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (ZEN5_ERROR, ZEN5_CAUSE),
        (
            "clCreateContext failed: DEVICE_NOT_AVAILABLE",
            "clCreateContext failed: DEVICE_NOT_AVAILABLE",
        ),
        ("Build on <pyopencl.Device 'x'>:\n\n(options: -I x)\nsomething odd\n", "something odd"),
        ("", "RuntimeError"),
        ("error: " + "x" * 400, "error: " + "x" * 290 + "..."),
    ],
)
def test_first_cause_is_the_first_meaningful_line(error: str, cause: str) -> None:
    assert cldev.first_cause(RuntimeError(error)) == cause


def test_real_devices_that_cannot_build_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's own devices, with the build forced to fail as on Zen 5."""
    real = cldev.devices()
    if not real:
        opencl_device.skip_or_fail("no OpenCL device listed here")

    def fail(device: Any) -> None:
        raise cl.RuntimeError(ZEN5_ERROR)

    monkeypatch.setattr(cldev, "build_probe", fail)
    monkeypatch.setattr(cldev, "_cache", {})
    with pytest.raises(OpenCLUnavailable) as info:
        make_backend("0")
    for p, d, dev in real:
        assert f"{p}:{d} {dev.name.strip()!r}" in str(info.value)
    assert str(info.value).count(ZEN5_CAUSE) == len(real)


@pytest.mark.usefixtures("opencl_device")
def test_the_default_device_passes_the_real_probe() -> None:
    chosen = check_device("0")
    assert chosen.ok and chosen.cause == ""
    assert chosen == working_devices()[0] == probe(chosen.device)
    assert make_backend("0").probe == chosen


# ---- voxpool serve / run on a machine without a working device ----------------


def write_config(tmp_path: Path, device: str = "0") -> Path:
    config = {
        "models": [
            {"id": "vad", "family": "silero_vad", "backend": "opencl", "device": device},
            {"id": "tts", "family": "piper", "mode": "streaming"},
        ]
    }
    path = tmp_path / "server.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Configs the HTTP server would have been started with (it is never started)."""
    import server.cmd_serve

    started: list[Any] = []

    async def serve(config: Any, trace: Any) -> int:
        started.append(config)
        return 0  # the exit code, when serve returns one

    monkeypatch.setattr(server.cmd_serve, "serve", serve)
    # serve's BLAS thread limit would outlive the test (environment, threadpoolctl)
    monkeypatch.setattr(server.cmd_serve, "limit_blas_threads", lambda threads: None)
    return started


def test_serve_exits_with_one_line_when_no_device_works(
    install: Any, served: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install([zen5_pip_cpu()])
    code = cli.main(["serve", "--parallel-jobs", "--config", str(write_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and served == []
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("voxpool serve: model(s) vad: backend 'opencl' device '0': opencl: ")
    assert ZEN5_CAUSE in err and "pthread-AMD Ryzen 9 9950X" in err
    assert "sudo apt-get install pocl-opencl-icd" in err


def test_serve_exits_when_the_configured_device_cannot_build(
    install: Any, served: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install([zen5_pip_cpu()], [debian_cpu()])
    code = cli.main(["serve", "--parallel-jobs", "--config", str(write_config(tmp_path, "0:0"))])
    err = capsys.readouterr().err
    assert code == 2 and served == []
    assert "configured device '0:0'" in err and ZEN5_CAUSE in err and err.count("\n") == 1


def test_serve_starts_on_the_device_that_works(
    install: Any, served: list[Any], tmp_path: Path
) -> None:
    install([zen5_pip_cpu()], [debian_cpu()])
    code = cli.main(["serve", "--parallel-jobs", "--config", str(write_config(tmp_path))])
    assert code == 0
    assert [m.backend for m in served[0].models] == ["opencl", "numpy"]


def test_run_exits_with_one_line_when_no_device_works(
    install: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install([zen5_pip_cpu()])
    out = tmp_path / "hello.wav"
    code = cli.main(["run", "tts", "--text", "Hello.", "-o", str(out), "--backend", "opencl"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1
    assert err.startswith("voxpool run: backend 'opencl' is not available: opencl: no device")
    assert ZEN5_CAUSE in err and "pocl-opencl-icd" in err


def test_check_backends_names_the_models_and_skips_numpy(install: Any) -> None:
    install([debian_cpu()])
    specs = [
        ModelSpec(id="a", family="piper", backend="opencl", device="7:7"),
        ModelSpec(id="b", family="whisper", backend="opencl", device="7:7"),
        ModelSpec(id="c", family="piper", backend="numpy", device="whatever"),
    ]
    with pytest.raises(
        BackendUnavailable, match=r"model\(s\) a, b: backend 'opencl' device '7:7': .*no device"
    ):
        check_backends(specs)
    check_backends([*specs[2:], ModelSpec(id="d", family="piper", backend="opencl", device="0")])
