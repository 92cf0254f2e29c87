"""`glm5lib doctor` (what vLLM will do with a GLM-5 model on a GPU or the CPU), `glm5lib plan` (will it fit, how
much context, how fast) and `glm5lib serve` (vLLM's OpenAI server with the glm5lib plugin, for an HF directory or
a glm-dsa GGUF)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from contextlib import contextmanager
from typing import Iterator

from glm5lib.errors import UserError
from glm5lib.model.spec import PRESET_NAMES


@contextmanager
def status_line(text: str) -> Iterator[None]:
    """`text` on stderr while the block runs, erased after; nothing when stderr is not a terminal (CI logs,
    pipes), so an error raised inside is printed on its own line."""
    tty = sys.stderr.isatty()
    if tty:
        sys.stderr.write(text)
        sys.stderr.flush()
    try:
        yield
    finally:
        if tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


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
    p.add_argument("-v", "--verbose", action="store_true",
                   help="every reason in full, vLLM's whole failure message, and vLLM's import-time log lines")
    p.set_defaults(func=_doctor)

    q = subparsers.add_parser("plan", help="will a GLM-5 model fit N GPUs: weights, KV tokens, decode estimate, "
                                           "vLLM command",
                              description="From headers only: weight bytes per GPU at tensor parallel N, vLLM's "
                                          "reserve (estimated), KV-cache tokens and concurrent sequences, a decode "
                                          "estimate per batch size and the matching vLLM command. Exit 0 fits, "
                                          "1 does not fit, 2 unusable input.")
    q.add_argument("model", nargs="?", help="glm-dsa .gguf (any shard; headers only), HF directory or config.json")
    q.add_argument("--preset", choices=PRESET_NAMES, help="a hypothetical file of a named model (with --quant)")
    q.add_argument("--quant", help="types of a hypothetical file: Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, BF16, ... "
                                   "(default: the file's own; BF16 for a preset)")
    q.add_argument("--gpus", type=int, required=True, help="GPUs = tensor-parallel size")
    q.add_argument("--gpu-mem", help="memory per GPU: 96GB (10^9), 80GiB (2^30), 143771MiB (default: --gpu's)")
    q.add_argument("--gpu", help="card from the table (h200, h100, a100, rtx-pro-6000, l40s, rtx-4090, rtx-5090, b200)")
    q.add_argument("--cc", help="compute capability of the GPUs (8.0, 8.9, 9.0, 10.0, 12.0)")
    q.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8_ds_mla", "bfloat16"))
    q.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="serving dtype (default bfloat16)")
    q.add_argument("--max-model-len", type=int, help="default: the model's max positions")
    q.add_argument("--max-num-seqs", type=int, default=256)
    q.add_argument("--max-num-batched-tokens", type=int, default=8192)
    q.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    q.add_argument("--residency", default="quantized", choices=("quantized", "dense-attn", "dequantized"),
                   help="quantized: GGUF blocks kept (default); dense-attn: non-expert weights dequantized; "
                        "dequantized: every weight in the serving dtype")
    q.add_argument("--no-mtp", action="store_true", help="leave the MTP layer (speculative decoding) out")
    q.add_argument("--context", type=int, help="context length of the decode estimate (default min(max-model-len, "
                                               "16384))")
    q.add_argument("--batches", default="1,8,32,64,128,256", help="batch sizes of the decode estimate")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=_plan)

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
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--compile", action="store_true",
                      help="let vLLM compile / capture CUDA graphs also on CPU (default there: --enforce-eager)")
    mode.add_argument("--eager", action="store_true", help="--enforce-eager also on CUDA (default there: CUDA graphs)")
    s.add_argument("--dry-run", action="store_true", help="prepare the model directory, print the command, exit")
    s.add_argument("--vllm-args", default="", help="more vLLM arguments, one quoted string (e.g. '--seed 3')")
    s.set_defaults(func=_serve)


def _doctor(args: argparse.Namespace) -> int:
    from glm5lib.serving.doctor import diagnose, format_report, import_vllm, load_model_config, parse_target

    targets = args.cc or ["12.0"]
    load_model_config(args.model)  # a bad model or target is one error line, before vLLM's import
    for cc in targets:
        parse_target(cc)
    with status_line("importing vLLM (10-30 s) ..."):
        import_vllm(verbose=args.verbose)
    reports = [diagnose(args.model, cc, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, tp=args.tp,
                        block_size=args.block_size) for cc in targets]
    if args.json:
        data = [r.as_dict() for r in reports]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=1, default=str))
    else:
        print("\n\n".join(format_report(r, verbose=args.verbose) for r in reports))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from glm5lib.serving.plan import PlanOptions, format_plan, load_bench, make_plan, parse_size, resolve_model

    try:
        batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
    except ValueError:
        raise UserError(f"--batches {args.batches}: comma-separated integers") from None
    if not batches or min(batches) < 1:
        raise UserError(f"--batches {args.batches}: positive integers")
    mi = resolve_model(args.model, args.preset, args.quant)
    opts = PlanOptions(gpus=args.gpus, gpu_mem_bytes=parse_size(args.gpu_mem) if args.gpu_mem else None, cc=args.cc,
                       gpu=args.gpu, kv_cache_dtype=args.kv_cache_dtype, dtype=args.dtype,
                       max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       gpu_memory_utilization=args.gpu_memory_utilization, residency=args.residency,
                       include_mtp=not args.no_mtp, context=args.context, batches=batches)
    plan = make_plan(mi, opts, load_bench())
    if args.json:
        print(json.dumps(plan.as_dict(), indent=1))
    else:
        print(format_plan(plan))
    return 0 if plan.fits else 1


def _serve(args: argparse.Namespace) -> int:
    from glm5lib.serving.server import ServeOptions, VLLMServer

    extra = shlex.split(args.vllm_args)
    opts = ServeOptions(model=args.model, port=args.port, host=args.host, dtype=args.dtype,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        served_model_name=args.served_model_name, attention_backend=args.attention_backend,
                        enforce_eager=True if args.eager else (False if args.compile else None), extra_args=extra)
    srv = VLLMServer(opts)  # the same command, environment and process handling as the notebooks and tests
    print(f"model directory: {srv.model_dir}\nserved model name: {srv.model_name}\n$ {' '.join(srv.cmd)}", flush=True)
    if args.dry_run:
        return 0
    try:
        return srv.run_foreground()
    except FileNotFoundError as exc:
        raise UserError(f"cannot start vLLM: {exc}") from None
