"""`glm5lib doctor` (what vLLM will do with a GLM-5 model on a GPU or the CPU) and `glm5lib serve` (vLLM's
OpenAI server with the glm5lib plugin, for an HF directory or a glm-dsa GGUF)."""

from __future__ import annotations

import argparse
import json
import shlex

from glm5lib.errors import UserError
from glm5lib.model.spec import PRESET_NAMES


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="which vLLM attention backend / indexer a GLM-5 model gets, and why",
                              description="Print every MLA backend vLLM would consider for MODEL on the target, in "
                                          "its priority order, accepted or rejected with vLLM's own reason; the "
                                          "indexer; and what the glm5lib plugin adds.")
    p.add_argument("model", help="HF model directory, config.json, glm-dsa .gguf (any shard), or a preset: "
                                 + ", ".join(PRESET_NAMES))
    p.add_argument("--cc", action="append", default=None, metavar="CAP",
                   help="target compute capability (8.0, 8.9, 9.0, 10.0, 12.0, sm120) or 'cpu'; repeatable "
                        "(default 12.0)")
    p.add_argument("--dtype", default="bfloat16", help="model dtype (bfloat16, float16, float32)")
    p.add_argument("--kv-cache-dtype", default="auto", help="vLLM kv-cache dtype (auto, bfloat16, fp8_ds_mla, ...)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (heads per GPU = heads / tp)")
    p.add_argument("--block-size", type=int, default=None, help="--block-size you would pass to vLLM")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_doctor)

    s = subparsers.add_parser("serve", help="vLLM OpenAI server for a GLM-5 HF directory or glm-dsa GGUF",
                              description="Runs python -m vllm.entrypoints.openai.api_server with the glm5lib "
                                          "plugin. A glm-dsa GGUF is passed as --model as it is: the plugin "
                                          "rebuilds its config and tokenizer and keeps its blocks quantized.")
    s.add_argument("model", help="HF model directory or .gguf file (merged, or the first shard of a set)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--dtype", default="auto")
    s.add_argument("--max-model-len", type=int, default=4096)
    s.add_argument("--max-num-seqs", type=int, default=64)
    s.add_argument("--attention-backend", default=None, help="e.g. GLM5_SPARSE_MLA (CUDA)")
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--compile", action="store_true",
                   help="let vLLM compile / capture CUDA graphs (default --enforce-eager: the glm5lib indexer is eager)")
    s.add_argument("--dry-run", action="store_true", help="prepare the model directory, print the command, exit")
    s.add_argument("--vllm-args", default="", help="more vLLM arguments, one quoted string (e.g. '--seed 3')")
    s.set_defaults(func=_serve)


def _doctor(args: argparse.Namespace) -> int:
    from glm5lib.serving.doctor import diagnose, format_report

    reports = [diagnose(args.model, cc, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, tp=args.tp,
                        block_size=args.block_size) for cc in (args.cc or ["12.0"])]
    if args.json:
        data = [r.as_dict() for r in reports]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=1, default=str))
    else:
        print("\n\n".join(format_report(r) for r in reports))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from glm5lib.serving.server import ServeOptions, VLLMServer

    extra = shlex.split(args.vllm_args)
    opts = ServeOptions(model=args.model, port=args.port, host=args.host, dtype=args.dtype,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        served_model_name=args.served_model_name, attention_backend=args.attention_backend,
                        enforce_eager=not args.compile, extra_args=extra)
    srv = VLLMServer(opts)  # the same command, environment and process handling as the notebooks and tests
    print(f"model directory: {srv.model_dir}\nserved model name: {srv.model_name}\n$ {' '.join(srv.cmd)}", flush=True)
    if args.dry_run:
        return 0
    try:
        return srv.run_foreground()
    except FileNotFoundError as exc:
        raise UserError(f"cannot start vLLM: {exc}") from None
