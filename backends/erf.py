"""The float32 erf every backend uses for GELU: one set of coefficients, three languages.

numpy has no erf ufunc, so all backends compute the same rational approximation
(the odd/even polynomial ratio Eigen and XLA use for float32, accurate to a few
ulp): the numpy backend in Python, the OpenCL and CUDA backends in C generated
here from the very same literals, so the three cannot drift apart.
"""

from __future__ import annotations

import numpy as np

ALPHA = (
    "-2.72614225801306e-10",
    "2.77068142495902e-08",
    "-2.10102402082508e-06",
    "-5.69250639462346e-05",
    "-7.34990630326855e-04",
    "-2.95459980854025e-03",
    "-1.60960333262415e-02",
)
BETA = (
    "-1.45660718464996e-05",
    "-2.13374055278905e-04",
    "-1.68282697438203e-03",
    "-7.37332916720468e-03",
    "-1.42647390514189e-02",
)
ERF_ALPHA = [np.float32(float(c)) for c in ALPHA]
ERF_BETA = [np.float32(float(c)) for c in BETA]


def c_source(qualifier: str, clamp: str) -> str:
    """``float vox_erf(float x)`` in C; ``clamp`` is an expression clamping ``x`` to [-4, 4]."""

    def horner(var: str, coefficients: tuple[str, ...]) -> list[str]:
        lines = [f"    float {var} = x2 * {coefficients[0]}f;"]
        lines += [f"    {var} += {c}f; {var} *= x2;" for c in coefficients[1:-1]]
        lines.append(f"    {var} += {coefficients[-1]}f;")
        return lines

    body = [
        f"{qualifier} float vox_erf(float x) {{",
        f"    x = {clamp};",
        "    const float x2 = x * x;",
        *horner("p", ALPHA),
        *horner("q", BETA),
        "    p *= x;",
        "    return p / q;",
        "}",
    ]
    return "\n".join(body) + "\n"
