"""OpenCL devices: which exist, which can build and run kernels, and which one a spec selects.

A device is usable only if its compiler works: the PoCL bundled with the pip
wheels (``pocl-binary-distribution`` 3.0, LLVM 14) lists a CPU device on every
x86-64 machine but cannot build any kernel on CPUs its LLVM does not know (AMD
Zen 5: "unknown target CPU 'generic'"). So every device is probed once per
process by building and running a tiny kernel (:func:`probe`, cached per
device), and selection uses the probe:

- ``"0"`` or ``""`` (the default): the first device whose probe succeeds.
- ``"cpu"`` / ``"gpu"``: the first device of that type whose probe succeeds.
- ``"platform:device"`` or another index over every device: exactly that one.

When no selected device works, :class:`OpenCLUnavailable` names every device
tried (platform, device, driver version), the first meaningful line of each
build log and the fix.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
import numpy as np
import pyopencl as cl

POCL = "Debian's PoCL (sudo apt-get install pocl-opencl-icd)"
FIX = f"fix: install {POCL} or another OpenCL driver that supports this machine"
AUTO = ("", "0")
"""Device specs meaning "the first working device"."""

_PROBE_SOURCE = """
__kernel void voxpool_probe(__global float *x, const int n) {
    int i = get_global_id(0);
    if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
"""
_BOILERPLATE = ("clBuildProgram failed", "Build on <", "(options:", "(source saved as")
_CAUSE_CHARS = 300


class OpenCLUnavailable(RuntimeError):
    """No OpenCL device that can build our kernels (or the configured one cannot)."""


@attrs.frozen
class DeviceProbe:
    """Whether one device built and ran the probe kernel; ``cause`` says why not."""

    platform_index: int
    device_index: int
    platform: str
    name: str
    version: str
    """The platform version: for PoCL its release and LLVM version."""
    driver: str
    is_cpu: bool
    is_gpu: bool
    ok: bool
    cause: str = ""
    """The first meaningful line of the build log (or error) when not ``ok``."""
    device: Any = attrs.field(default=None, eq=False, repr=False)
    """The ``pyopencl.Device``."""

    @property
    def spec(self) -> str:
        """The explicit device spec selecting exactly this device."""
        return f"{self.platform_index}:{self.device_index}"

    def describe(self) -> str:
        """One line naming the device: spec, device, platform and its versions."""
        return (
            f"{self.spec} {self.name!r} on {self.platform!r} "
            f"(platform {self.version!r}, driver {self.driver!r})"
        )


_cache: dict[Any, DeviceProbe] = {}
_lock = threading.Lock()


def devices() -> list[tuple[int, int, cl.Device]]:
    """Every OpenCL device as (platform index, device index, device), in platform order."""
    found: list[tuple[int, int, cl.Device]] = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader found no platform at all
        return found
    for p, platform in enumerate(platforms):
        try:
            platform_devices = platform.get_devices()
        except cl.Error:  # a platform with no device
            continue
        for d, dev in enumerate(platform_devices):
            found.append((p, d, dev))
    return found


def build_probe(device: cl.Device) -> None:
    """Build and run the probe kernel on ``device``; raises on any failure."""
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, _PROBE_SOURCE).build()
    host = np.arange(8, dtype=np.float32)
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    buf = cl.Buffer(ctx, flags, hostbuf=host)
    prg.voxpool_probe(queue, (8,), None, buf, np.int32(host.size))
    out = np.empty_like(host)
    cl.enqueue_copy(queue, out, buf, is_blocking=True)
    expected = host * 2 + 1
    if not np.array_equal(out, expected):
        raise RuntimeError(f"the probe kernel computed {out.tolist()}, not {expected.tolist()}")


def first_cause(error: BaseException) -> str:
    """The first meaningful line of a build failure: an ``error:`` line when there is one."""
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not line.startswith(_BOILERPLATE)]
    errors = [line for line in lines if line.lower().startswith("error")]
    cause = (errors or lines or [type(error).__name__])[0]
    return cause if len(cause) <= _CAUSE_CHARS else cause[: _CAUSE_CHARS - 3] + "..."


def _key(device: Any) -> Any:
    return getattr(device, "int_ptr", None) or id(device)


def _probe_at(p: int, d: int, device: Any) -> DeviceProbe:
    key = _key(device)
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            return cached
        try:
            build_probe(device)
        except Exception as exc:  # any failure makes the device unusable; keep its cause
            ok, cause = False, first_cause(exc)
        else:
            ok, cause = True, ""
        result = DeviceProbe(
            platform_index=p,
            device_index=d,
            platform=str(device.platform.name).strip(),
            name=str(device.name).strip(),
            version=" ".join(str(device.platform.version).split()),
            driver=" ".join(str(device.driver_version).split()),
            is_cpu=bool(device.type & cl.device_type.CPU),
            is_gpu=bool(device.type & cl.device_type.GPU),
            ok=ok,
            cause=cause,
            device=device,
        )
        _cache[key] = result
        return result


def probe(device: cl.Device) -> DeviceProbe:
    """The (cached) probe of ``device``, one of :func:`devices`."""
    for p, d, dev in devices():
        if dev == device:
            return _probe_at(p, d, dev)
    raise ValueError(f"opencl: {device!r} is not a device of any platform")


def probe_all() -> list[DeviceProbe]:
    """The probe of every device, in platform order."""
    return [_probe_at(p, d, dev) for p, d, dev in devices()]


def working_devices() -> list[DeviceProbe]:
    """The devices that built and ran the probe kernel, in platform order."""
    return [result for result in probe_all() if result.ok]


def clear_cache() -> None:
    """Forget every probe result (the next selection probes again)."""
    with _lock:
        _cache.clear()


def _none_work(what: str, tried: list[DeviceProbe]) -> OpenCLUnavailable:
    causes = "; ".join(f"{r.describe()}: {r.cause}" for r in tried)
    return OpenCLUnavailable(f"opencl: no {what} can build OpenCL kernels: tried {causes}; {FIX}")


def _is_kind(device: Any, kind: str) -> bool:
    """Whether ``device`` is of the type a "cpu" / "gpu" spec asks for (any type otherwise)."""
    if kind == "cpu":
        return bool(device.type & cl.device_type.CPU)
    if kind == "gpu":
        return bool(device.type & cl.device_type.GPU)
    return True


def _matches(spec: str, index: int, p: int, d: int) -> bool:
    """Whether an explicit spec ("platform:device" or a flat index) names this device."""
    if ":" in spec:
        sp, _, sd = spec.partition(":")
        return (sp.strip(), sd.strip()) == (str(p), str(d))
    return spec == str(index)


def select_device(spec: str = "0") -> DeviceProbe:
    """The probe of the device ``spec`` selects (see the module docstring).

    Raises :class:`OpenCLUnavailable` when the selected device (or, for the
    default and ``cpu``/``gpu``, every candidate) fails its probe or when there
    is no device at all, and ``ValueError`` for a spec naming no device.
    """
    spec = (spec or "").strip()
    found = devices()
    if not found:
        raise OpenCLUnavailable(f"opencl: no OpenCL device found; {FIX}")
    kind = spec.lower()
    if spec in AUTO or kind in ("cpu", "gpu"):
        tried: list[DeviceProbe] = []
        for p, d, dev in found:
            if not _is_kind(dev, kind):
                continue
            result = _probe_at(p, d, dev)
            if result.ok:
                return result
            tried.append(result)
        if tried:
            raise _none_work(
                f"{kind.upper()} device" if kind in ("cpu", "gpu") else "device", tried
            )
    else:
        for i, (p, d, dev) in enumerate(found):
            if _matches(spec, i, p, d):
                result = _probe_at(p, d, dev)
                if result.ok:
                    return result
                raise OpenCLUnavailable(
                    f"opencl: the configured device {spec!r}, {result.describe()}, "
                    f"cannot build OpenCL kernels: {result.cause}; fix: use device '0' "
                    f"(the first device that works) or install {POCL}"
                )
    names = ", ".join(f"{p}:{d} {dev.name.strip()}" for p, d, dev in found)
    raise ValueError(f"opencl: no device {spec!r}; available: {names}")
