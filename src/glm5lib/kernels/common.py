"""Small Triton helpers shared by the kernels, and the CPU fallback switch.

Without a CUDA GPU the kernels run in Triton's interpreter (numpy; slow, for tests and tiny CPU serving).
Triton picks the interpreter when a function is decorated, so the switch must be set before any kernel
module is imported: `glm5lib.kernels` imports this module first.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def e4m3_bits_to(x, DOT_DTYPE: tl.constexpr, FP8_HW: tl.constexpr):
    """uint8 e4m3 bits -> DOT_DTYPE. Returns (values, factor): the true value is values * factor.

    sm_89+ converts in hardware (factor 1). sm_80 has no fp8 conversion, so the bits are moved into an fp16
    (sign to bit 15, exponent+mantissa to bits 7..14): that fp16 equals the e4m3 value / 256 exactly, subnormals
    included (the exponent biases differ by 8); the caller multiplies the 256 into its per-row scale.
    """
    if FP8_HW:
        return x.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE), 1.0
    xi = x.to(tl.int16)
    h = ((xi & 0x80) << 8) | ((xi & 0x7F) << 7)
    return h.to(tl.float16, bitcast=True).to(DOT_DTYPE), 256.0


def fp8_hw(device: torch.device) -> bool:
    """Whether the device converts e4m3 in hardware (sm_89 and newer; the interpreter emulates both paths)."""
    if os.environ.get("GLM5LIB_FP8_SOFTWARE") == "1":  # tests: exercise the sm_80 path anywhere
        return False
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)
