"""Compiled code's direct access to memory and C functions: numba intrinsics.

Each is a few lines of LLVM IR that numba inlines where a compiled function calls it:
atomic loads, stores, adds and compare-and-swaps on an int64 at an address (the
hand-over board of :mod:`backends.handoff`, a shared tile counter), the x86 ``pause``,
an IEEE half's bits as its float32 value (:func:`widen`),
the cycle counter, a call of a C function by its address, and ``C += A @ B`` by the
BLAS's ILP64 ``cblas_sgemm`` at an address (:data:`backends.piper.blas.ADDRESS`), so a
compiled loop calls the BLAS without the GIL and without ctypes' per-call argument
conversion. Nothing here checks an address: the callers check their operands first.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any, cast

from llvmlite import binding, ir
from numba.core import cgutils, types
from numba.core import config as _numba_config
from numba.extending import intrinsic

X86 = platform.machine().lower() in ("x86_64", "amd64")

_config: Any = _numba_config
"""numba's settings (not typed: set by name)."""


def _has_half_conversion() -> bool:
    """Whether compiled code here converts halves by an instruction: an x86-64 CPU with F16C
    (every AVX2 one) for which numba compiles (its default, the host CPU). Elsewhere LLVM
    calls a runtime helper that numba does not link: the call crashes the process (seen
    with ``NUMBA_CPU_NAME=generic``), so halves are not used there."""
    if not X86 or _config.CPU_NAME not in (None, "host") or _config.CPU_FEATURES:
        return False
    return bool(binding.get_host_cpu_features().get("f16c", False))


HALVES = _has_half_conversion()
"""Whether :func:`widen` may be compiled for a uint16 (halves' bits): packed weights
(:mod:`backends.panels`) are stored as halves only where it is true."""


def _function(builder: Any, signature: Any, name: str) -> Any:
    """The LLVM function ``name`` (an intrinsic) declared in the module being built."""
    declare: Any = cgutils.get_or_insert_function
    return declare(builder.module, signature, name)


def _i64_pointer(builder: Any, address: Any) -> Any:
    return builder.inttoptr(address, ir.IntType(64).as_pointer())


def _load_typing(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.load_atomic(_i64_pointer(builder, args[0]), "seq_cst", 8)

    return types.int64(types.int64), codegen


def _store_typing(typingctx: Any, address: Any, value: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.store_atomic(args[1], _i64_pointer(builder, args[0]), "seq_cst", 8)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


def _add_typing(typingctx: Any, address: Any, value: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.atomic_rmw("add", _i64_pointer(builder, args[0]), args[1], "seq_cst")

    return types.int64(types.int64, types.int64), codegen


def _swap_typing(typingctx: Any, address: Any, expected: Any, value: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        pointer = _i64_pointer(builder, args[0])
        pair = builder.cmpxchg(pointer, args[1], args[2], "seq_cst", "seq_cst")
        return builder.zext(builder.extract_value(pair, 1), ir.IntType(64))

    return types.int64(types.int64, types.int64, types.int64), codegen


def _pause_typing(typingctx: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        if X86:
            pause = ir.FunctionType(ir.VoidType(), [])
            builder.call(_function(builder, pause, "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()

    return types.void(), codegen


def _call_typing(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        function = ir.FunctionType(ir.IntType(32), [])
        builder.call(builder.inttoptr(args[0], function.as_pointer()), [])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


def _cycles_typing(typingctx: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        counter = ir.FunctionType(ir.IntType(64), [])
        return builder.call(_function(builder, counter, "llvm.readcyclecounter"), [])

    return types.int64(), codegen


def _pointer_typing(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.FloatType().as_pointer())

    pointer: Any = types.CPointer
    return pointer(types.float32)(types.int64), codegen


def _int_pointer_typing(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return _i64_pointer(builder, args[0])

    pointer: Any = types.CPointer
    return pointer(types.int64)(types.int64), codegen


def _sgemm_typing(
    typingctx: Any, address: Any, m: Any, n: Any, k: Any, a: Any, lda: Any, b: Any, ldb: Any,
    c: Any, ldc: Any,
) -> Any:  # fmt: skip
    """``C += A @ B`` (row major, no transposes, alpha = beta = 1) by the ILP64 ``cblas_sgemm``
    at ``address`` (:data:`backends.piper.blas.ADDRESS`), its matrices given by address."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        ptr = ir.IntType(8).as_pointer()
        params = [i32, i32, i32, i64, i64, i64, f32, ptr, i64, ptr, i64, f32, ptr, i64]
        function = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), params).as_pointer())
        m, n, k, a, lda, b, ldb, c, ldc = args[1:]
        one, enum = ir.Constant(f32, 1.0), (ir.Constant(i32, v) for v in (101, 111, 111))
        pa, pb, pc = (builder.inttoptr(x, ptr) for x in (a, b, c))
        builder.call(function, [*enum, m, n, k, one, pa, lda, pb, ldb, one, pc, ldc])
        return context.get_dummy_value()

    return types.void(*([types.int64] * 10)), codegen


def _widen_typing(typingctx: Any, value: Any) -> Any:
    if value == types.float32:

        def same(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return args[0]

        return types.float32(types.float32), same
    if value != types.uint16:
        return None

    def convert(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), convert


def _half_pointer_typing(typingctx: Any, address: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(16).as_pointer())

    pointer: Any = types.CPointer
    return pointer(types.uint16)(types.int64), codegen


def _intrinsic(typing: Callable[..., Any]) -> Callable[..., Any]:
    return cast(Callable[..., Any], intrinsic(typing))


load = _intrinsic(_load_typing)
"""``load(address)``: the int64 at ``address`` (sequentially consistent)."""
store = _intrinsic(_store_typing)
"""``store(address, value)``: writes the int64 (sequentially consistent)."""
add = _intrinsic(_add_typing)
"""``add(address, value)``: adds to the int64 atomically; returns the value before."""
swap = _intrinsic(_swap_typing)
"""``swap(address, expected, value)``: compare-and-swap; 1 where it wrote, else 0."""
pause = _intrinsic(_pause_typing)
"""``pause()``: the x86 spin-wait hint (nothing elsewhere)."""
cycles = _intrinsic(_cycles_typing)
"""``cycles()``: the CPU's cycle counter."""
floats = _intrinsic(_pointer_typing)
"""``floats(address)``: a float32 pointer (for ``numba.carray``)."""
halves = _intrinsic(_half_pointer_typing)
"""``halves(address)``: a uint16 pointer (halves' bits, for ``numba.carray``)."""
widen = _intrinsic(_widen_typing)
"""``widen(w)``: a weight's element as float32: a float32 as it is, a uint16 as the value of
the IEEE half whose bits it holds (exact: every half is a float32; F16C's conversion, which
LLVM vectorizes; only where :data:`HALVES`)."""
ints = _intrinsic(_int_pointer_typing)
"""``ints(address)``: an int64 pointer (for ``numba.carray``)."""
sgemm = _intrinsic(_sgemm_typing)
"""``sgemm(address, m, n, k, a, lda, b, ldb, c, ldc)``: ``C += A @ B``, row major, by the
ILP64 ``cblas_sgemm`` at ``address``, the matrices given by address."""
call = _intrinsic(_call_typing)
"""``call(address)``: calls the C function ``int f(void)`` at ``address``."""
