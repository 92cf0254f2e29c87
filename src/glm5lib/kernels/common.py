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


def capturing(device: torch.device) -> bool:
    """Whether work on the device's current stream is being captured into a CUDA graph (the kernels that route
    captured calls differently: `mla.sparse_mla`, `topk.topk_select`)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def fp8_hw(device: torch.device) -> bool:
    """Whether the device converts e4m3 in hardware (sm_89 and newer; the interpreter emulates both paths)."""
    if FP8_SOFTWARE:
        return False
    if device.type != "cuda":
        return True
    return capability(device) >= (8, 9)


# ---- pre-bound launches -----------------------------------------------------------------------------------------
#
# `kernel[grid](...)` binds every argument, works out its specialization (dtypes, 16-byte alignment, ints equal
# to 1 or divisible by 16) and looks the compiled kernel up on each call: host time that an eager decode layer
# pays on every launch. `Prebound` keeps the compiled kernel per specialization key (the same properties,
# computed from the call's own arguments) and calls its launcher directly. It leans on Triton's launcher calling
# convention (3.3 and later: grid, stream, function, packed metadata, launch metadata, two hooks, then every
# argument in signature order, constexprs included): a launcher that refuses the call (TypeError) switches it
# back to the plain launch for good. On by default for the Triton versions it was checked on (the GPU harness
# runs the eager decode step with and without it and requires identical outputs); GLM5LIB_TRITON_PREBOUND=0
# turns it off, =1 turns it on for any Triton. Never used by the interpreter.
PREBOUND_CHECKED = ((3, 6),)


def _prebound_default(env: str | None, version: str) -> bool:
    if env in ("0", "1"):
        return env == "1"
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return major_minor in PREBOUND_CHECKED


PREBOUND = _prebound_default(os.environ.get("GLM5LIB_TRITON_PREBOUND"), triton.__version__)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # decided before Triton was imported (above)


# ---- programmatic dependent launch --------------------------------------------------------------------------------
#
# A split launch is two kernels: the attention kernel writes fp32 partials, a merge kernel combines them. Launched
# plainly, the merge starts only once the kernel has finished and the launch has gone through the front end (a few
# us at small batches, where the whole step takes 10-40 us). With programmatic dependent launch (sm_90 and newer;
# CUDA's `cudaLaunchAttributeProgrammaticStreamSerialization`, Triton's `launch_pdl` option) the merge's programs are
# placed on the SMs while the kernel's last programs still run: each program of the dispatched kernels (the Triton
# kernel, the ping-pong and dq kernels) executes `griddepcontrol.launch_dependents` first (`gdc_launch_dependents`;
# the fp8-cache kernel's after its tile loop, `mla_gluon_fp8mma.PDL_TRIGGER`), so the merge may launch once the
# kernel's last wave is resident (has triggered), and every merge program
# executes `griddepcontrol.wait` (`gdc_wait`) before anything else, which returns only when the kernel has completed
# and its writes are visible. So the merge reads what it read before; only its launch moves earlier. (A kernel without
# the trigger, e.g. the key-split wgmma kernel, lets its merge launch at its end, as a plain launch would.) FlashMLA
# launches its split-KV combine the same way. The merges take their launch keywords from `pdl_kw` / `merge_pdl_kw`,
# which set the wait and the launch option together. The instructions need sm_90 (ptxas refuses them for sm_80 /
# sm_89), so it never applies there, in the interpreter, or with a Triton that lacks either half.
# Off by default: measured on an H100 (NOTES.md round 25, `scripts/pdl_probe.py`, CUDA-graph replay), a plain merge
# launch starts 1.1 us after the kernel ends, so that is all PDL can save: bf16 8 heads B1 10.6 -> 10.0 us, 64-128
# heads 0.98-1.00x, while the fp8-cache kernel ran 5-29 % slower with its programs triggering first (8 heads B8
# 16.6 -> 21.5 us, B32 35.7 -> 43.4 us); triggering after its tile loop, 0.98-1.02x (round 26, `PDL_TRIGGER`'s
# comment). GLM5LIB_PDL=1 (or on / true) turns it on.
def _pdl_default(env: str | None) -> bool:
    return (env or "0").lower() in ("1", "on", "true")


PDL = _pdl_default(os.environ.get("GLM5LIB_PDL"))  # `mla.set_pdl` flips it later


@functools.lru_cache(maxsize=None)
def _triton_has_pdl() -> bool:
    """Whether this Triton has both halves: the launcher's `launch_pdl` option and the `gdc_*` instructions."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:  # a Triton without the NVIDIA backend or the instructions
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def pdl(device: torch.device) -> bool:
    """Whether split launches on `device` launch their merge as the kernel's programmatic dependent (see above): on
    (`PDL`), a CUDA device of compute capability 9.0 or newer, compiled (not interpreted), and a Triton with both
    halves."""
    return (PDL and device.type == "cuda" and not INTERPRETED and capability(device) >= (9, 0)
            and _triton_has_pdl())


def pdl_kw(on: bool) -> dict:
    """The launch keywords of a merge kernel that takes the `PDL` constexpr: the constexpr (its `gdc_wait`) and
    Triton's `launch_pdl` option together, so that one is never set without the other."""
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=False)


_MERGE_PDL_KW: dict = {}


def merge_pdl_kw(device: torch.device) -> dict:
    """`pdl_kw(pdl(device))`, kept per device (an eager layer's merge launch asks on every call); `mla.set_pdl`
    forgets them."""
    key = (device.type, device.index)
    kw = _MERGE_PDL_KW.get(key)
    if kw is None:
        kw = _MERGE_PDL_KW[key] = pdl_kw(pdl(device))
    return kw


def _spec_of(a):
    """What Triton specializes a launch argument on (ints first: most arguments are strides and sizes)."""
    t = type(a)
    if t is int:
        return (a == 1, a % 16 == 0, -(2**31) <= a < 2**31)
    if t is bool:
        return ("b", a)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, int):
        return ("i", a == 1, a % 16 == 0, -(2**31) <= a < 2**31)
    return t.__name__


def current_stream(index: int) -> int:
    """The raw CUDA stream PyTorch launches on (what Triton's own launch reads)."""
    return torch._C._cuda_getCurrentRawStream(index)


class Prebound:
    """`Prebound(kernel)(grid, *args, **constexprs_and_options)` == `kernel[grid](*args, **...)`."""

    OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

    def __init__(self, fn):
        self.fn = fn
        self.names = list(getattr(fn, "arg_names", []))
        self.compiled: dict = {}
        self.broken: str | None = None

    def __call__(self, grid, *args, **kw):
        return self.launch(grid, args, kw)

    def launch(self, grid, args: tuple, kw: dict, kw_key: tuple | None = None, device_index: int | None = None,
               spec: tuple | None = None):
        """The launch with `kw` (constexprs and options) given as a dict. A caller that launches the same `kw` again
        and again passes `kw_key = tuple(kw.values())` (and the device index) computed once, and may pass `spec`: a
        key at least as fine as Triton's specialization of `args` (e.g. every tensor's dtype and 16-byte alignment
        and the exact int values), cheaper to build than `_spec_of` over every argument."""
        if not PREBOUND or self.broken or INTERPRETED or not self.names:
            return self.fn[grid](*args, **kw)
        if device_index is None:
            device_index = args[0].device.index
        key = (tuple(map(_spec_of, args)) if spec is None else spec, tuple(kw.values()) if kw_key is None else kw_key,
               device_index)
        hit = self.compiled.get(key)
        if hit is None:
            if len(self.compiled) >= 4096:  # a caller whose spec holds ever-new values: start over
                self.compiled.clear()
            ck = self.fn[grid](*args, **kw)
            tail = tuple(kw[n] for n in self.names[len(args):])
            self.compiled[key] = (ck, tail)
            return ck
        ck, tail = hit
        g = tuple(grid) + (1, 1)
        try:
            ck.run(g[0], g[1], g[2], current_stream(device_index), ck.function, ck.packed_metadata, None, None, None,
                   *args, *tail)
        except TypeError as exc:  # another launcher convention: plain launches from now on
            self.broken = f"{type(exc).__name__}: {exc}"
            return self.fn[grid](*args, **kw)
        return ck
