"""Small Triton helpers shared by the kernels, the CPU fallback switch, and cached device facts.

Without a CUDA GPU the kernels run in Triton's interpreter (numpy; slow, for tests and tiny CPU serving).
Triton picks the interpreter when a function is decorated, so the switch must be set before Triton is
imported: every kernel module (`sparse_mla`, `indexer`) imports this module before `triton`. The pure-torch
`glm5lib.kernels.naive` does not, so importing it leaves Triton and the environment alone.

Device facts (SM count, compute capability) are cached per device index: the vLLM plugin launches the kernels
eagerly for every layer of every step, and `torch.cuda.get_device_properties` is not free.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton decided when it was imported (vLLM imports it) that its own language functions (tl.zeros, ...)
        # are compiled, not interpreted: glm5lib's kernels would fail inside the interpreter with "Cannot call
        # @triton.jit'd outside of the scope of a kernel"
        warnings.warn("Triton was imported before TRITON_INTERPRET=1 was set, so glm5lib's Triton kernels cannot run "
                      "on this CPU-only process; set TRITON_INTERPRET=1 in the environment", RuntimeWarning,
                      stacklevel=2)
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


# Read once (launches are hot); tests flip the module attribute instead of the environment.
FP8_SOFTWARE = os.environ.get("GLM5LIB_FP8_SOFTWARE") == "1"  # exercise the sm_80 e4m3 path anywhere


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device, cached."""
    return _capability(_index(device))


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); 132 elsewhere, so that the interpreter behaves as on
    an H200 and CPU tests exercise the split path."""
    if device.type != "cuda":
        return 132
    return _sm_count(_index(device))


def fp8_hw(device: torch.device) -> bool:
    """Whether the device converts e4m3 in hardware (sm_89 and newer; the interpreter emulates both paths)."""
    if FP8_SOFTWARE:
        return False
    if device.type != "cuda":
        return True
    return capability(device) >= (8, 9)
