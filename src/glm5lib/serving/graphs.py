"""A multi-layer GLM-5 decode step captured in a CUDA graph the way vLLM's runner does it, without vLLM.

    PYTHONPATH=src python3 -m glm5lib.serving.harness --graphs --json OUT.json     # H200: < 4 minutes
    python -m glm5lib.serving.harness --graphs --device cpu                        # tiny shapes, no capture

What vLLM's runner does for a uniform decode batch in FULL CUDA-graph mode (docs/glm5.md section 9), rebuilt:
persistent device buffers at the maximum size (block table, context lengths, slot mapping, query_start_loc, the
model's per-layer inputs), refilled in place every step; padding requests after the real ones (context 0,
null block 0, slot -1, no query tokens); the builders' per-step tensors refilled by the same
`paged.StepBuffers` calls `Glm5SparseMLAMetadataBuilder.build` and `Glm5IndexerMetadataBuilder.build` make;
then, per layer, what `Glm5SparseAttnIndexer` and `Glm5SparseMLAImpl` run: the MLA key row written at its
slot (here a capture-safe PyTorch scatter standing in for vLLM's `concat_and_cache_mla`), the indexer key
written (`paged.write_indexer_keys`), the static decode top-k (`paged.decode_topk`, scores `[T, max_model_len]`
into the shared workspace) and the sparse MLA forward (`paged.sparse_mla_forward`). The step is captured once,
on zeroed capture metadata (as `build_for_cudagraph_capture` sees it), at the padded batch size, then replayed
for two different steps (new block tables, context lengths, slots, inputs, fewer real requests in the second)
and compared with the same step run eagerly: outputs and top-k must be `torch.equal`. The eager top-k of the
real requests is also held to the per-request path (`paged.step_topk` one request at a time: same picks).

Per case (heads 8/16/64/128, bf16 and fp8_ds_mla caches, batch 1/32/128) on CUDA, per layer:
`graph_us` (replay), `kernel_us` (each kernel of the layer captured alone, 10 launches per graph, summed: the
GPU time of the work itself), `graph_over_kernel` (target <= 1.1), `eager_us` (back-to-back eager steps: host
or GPU, whichever is slower), `eager_host_us` (host time to issue one eager layer). FlashMLA cases: at batch 1,
`glm5lib.kernels.sparse_mla` and FlashMLA's `sparse_decode_fwd` (from the vLLM wheel's `_flashmla_C`, in
`.vendor/`) called eagerly back to back in the same process, and their host time per call. Last, the eager layer
with `kernels.common.Prebound` on and off (host time per layer; outputs equal to the graph's). The JSON is
rewritten after every case, so a crash part-way keeps what was measured.
On CPU (Triton's interpreter, tiny shapes) the same step runs eagerly twice on refilled buffers and must equal a
fresh eager run and the per-request path; nothing is captured or timed.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from glm5lib.kernels.naive import D_NOPE, D_QK, D_ROPE, FP8_DS_MLA_ROW_BYTES, INDEXER_DIM, INDEXER_FP8_ROW_BYTES
from glm5lib.model.spec import GLM5Config
from glm5lib.serving.harness import _events_us  # one CUDA-event timer for both harness modes

GLM5 = GLM5Config.glm5()
NULL_BLOCK = 0  # vLLM reserves block 0 for padding rows of the block table


@dataclass
class GraphCase:
    heads: int
    kv_format: str  # bf16 | fp8_ds_mla
    batch: int  # real requests in the first replayed step (the second has fewer)
    padded: int  # the captured batch size (vLLM's next capture size >= batch)
    layers: int = 3
    topk: int = GLM5.index_topk
    index_heads: int = GLM5.index_n_heads
    max_model_len: int = 8192
    block_size: int = 64

    @property
    def id(self) -> str:
        return f"graph-H{self.heads}-{self.kv_format}-B{self.batch}-pad{self.padded}-L{self.layers}"


def capture_size(batch: int) -> int:
    """vLLM's default capture sizes: 1, 2, 4, then multiples of 8 (16 from 256 on)."""
    for s in (1, 2, 4):
        if batch <= s:
            return s
    return 8 * math.ceil(batch / 8) if batch <= 256 else 16 * math.ceil(batch / 16)


def graph_cases(tiny: bool) -> list[GraphCase]:
    if tiny:
        return [GraphCase(4, "bf16", 3, 4, layers=2, topk=16, index_heads=4, max_model_len=256),
                GraphCase(4, "fp8_ds_mla", 2, 2, layers=2, topk=16, index_heads=4, max_model_len=256)]
    out = []
    for fmt in ("bf16", "fp8_ds_mla"):
        for b in (1, 32, 128):
            for h in (8, 16, 64, 128):
                # batch 32 replays at 31 real requests in a graph of 32 in the second step; 1 and 128 are exact
                out.append(GraphCase(h, fmt, b, capture_size(b)))
    return out


class DecodeStep:
    """Persistent buffers, caches and per-layer inputs of one decode step, and the step itself."""

    def __init__(self, case: GraphCase, device: torch.device, seed: int = 0):
        from glm5lib.kernels.naive import quantize_fp8_ds_mla
        from glm5lib.vllm_plugin.paged import StepBuffers, decode_logits_workspace, write_indexer_keys

        self.case, self.device = case, device
        self.g = torch.Generator(device="cpu").manual_seed(seed)
        gd = torch.Generator(device=device).manual_seed(seed + 1)  # bulk cache contents, drawn where they live
        c, bs, P = case, case.block_size, case.padded
        self.act = torch.bfloat16 if device.type == "cuda" else torch.float32  # interpreter: fp32 stands in
        self.fp8 = c.kv_format == "fp8_ds_mla"
        self.max_blocks = math.ceil(c.max_model_len / bs)
        self.num_blocks = P * self.max_blocks + 1  # + the null block
        rows = self.num_blocks * bs
        # MLA caches (+ one trash row past the last block: the harness's key write sends slot -1 there)
        width = FP8_DS_MLA_ROW_BYTES if self.fp8 else D_QK
        self.mla_store, self.mla_cache = [], []
        for _ in range(c.layers):
            kv = torch.randn(rows, D_QK, generator=gd, device=device, dtype=self.act)
            body = quantize_fp8_ds_mla(kv) if self.fp8 else kv
            store = torch.empty(rows + 1, width, dtype=body.dtype, device=device)
            store[:rows] = body
            store[rows:] = 0
            self.mla_store.append(store)
            self.mla_cache.append(store[:rows].view(self.num_blocks, bs, width))
        # indexer caches, every slot holding a key (fp8 + scale, block-split layout)
        self.idx_cache = []
        all_slots = torch.arange(rows, dtype=torch.int64, device=device)
        for _ in range(c.layers):
            cache = torch.zeros(self.num_blocks, bs, INDEXER_FP8_ROW_BYTES, dtype=torch.uint8, device=device)
            write_indexer_keys(cache, torch.randn(rows, INDEXER_DIM, generator=gd, device=device, dtype=self.act),
                               all_slots)
            self.idx_cache.append(cache)
        # vLLM's persistent step buffers (the runner's), sized for the captured batch
        self.block_table = torch.zeros(P, self.max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(P, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((P,), -1, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(P + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(P + 1, dtype=torch.int32)
        # the builders' own buffers (one StepBuffers each, as each builder owns one) and the shared pieces
        self.mla_buffers = StepBuffers(P, device)
        self.idx_buffers = StepBuffers(P, device)
        self.logits = decode_logits_workspace(device, P, c.max_model_len)
        self.topk_buffer = torch.full((P, c.topk), -1, dtype=torch.int32, device=device)
        # per-layer model inputs (the runner's static activations)
        H, HI = c.heads, c.index_heads
        self.q = [torch.zeros(P, H, D_QK, dtype=self.act, device=device) for _ in range(c.layers)]
        self.kv_new = [torch.zeros(P, D_QK, dtype=self.act, device=device) for _ in range(c.layers)]
        self.q_idx = [torch.zeros(P, HI, INDEXER_DIM, dtype=self.act, device=device) for _ in range(c.layers)]
        self.w_idx = [torch.zeros(P, HI, dtype=torch.float32, device=device) for _ in range(c.layers)]
        self.k_idx = [torch.zeros(P, INDEXER_DIM, dtype=self.act, device=device) for _ in range(c.layers)]
        # outputs, copied out of each layer (a graph's outputs must live at fixed addresses too)
        self.out = [torch.zeros(P, H, D_NOPE, dtype=self.act, device=device) for _ in range(c.layers)]
        self.topk_out = [torch.zeros(P, c.topk, dtype=torch.int32, device=device) for _ in range(c.layers)]
        self.req_id = self.mla_buffers.req_id_per_token[:P]
        self.token_lens = self.idx_buffers.token_lens[:P]
        self.host: dict = {}

    # ---- what the runner and the builders do on the host each step (outside the graph) ----

    def build(self) -> None:
        """The builders' `build()`: refill the derived buffers in place from the runner's buffers."""
        P = self.case.padded
        self.mla_buffers.fill_req_ids(self.query_start_loc, P, P)
        self.idx_buffers.fill_token_lens(self.seq_lens, P, 1)

    def capture_metadata(self) -> None:
        """Zeroed capture-time metadata: no request has a context, every slot is -1, every block the null one."""
        self.block_table.zero_()
        self.seq_lens.zero_()
        self.slot_mapping.fill_(-1)
        self.query_start_loc.copy_(torch.arange(self.case.padded + 1, dtype=torch.int32))
        self.query_start_loc_cpu.copy_(self.query_start_loc.cpu())
        self.build()

    def new_step(self, real: int) -> None:
        """A fresh decode step of `real` requests (random contexts, scrambled blocks), padded to the captured size."""
        c, g, P, bs = self.case, self.g, self.case.padded, self.case.block_size
        lo = max(2, min(c.topk // 2, c.max_model_len // 2))
        lens = torch.randint(lo, c.max_model_len + 1, (real,), generator=g, dtype=torch.int32)
        perm = torch.randperm(self.num_blocks - 1, generator=g)[: real * self.max_blocks].to(torch.int32) + 1
        table = torch.zeros(P, self.max_blocks, dtype=torch.int32)
        table[:real] = perm.view(real, self.max_blocks)
        last = (lens - 1).long()
        slots = torch.full((P,), -1, dtype=torch.int64)
        slots[:real] = table[torch.arange(real), last // bs].long() * bs + last % bs
        seq = torch.zeros(P, dtype=torch.int32)
        seq[:real] = lens
        qsl = torch.full((P + 1,), real, dtype=torch.int32)
        qsl[: real + 1] = torch.arange(real + 1, dtype=torch.int32)
        self.block_table.copy_(table)
        self.seq_lens.copy_(seq)
        self.slot_mapping.copy_(slots)
        self.query_start_loc.copy_(qsl)
        self.query_start_loc_cpu.copy_(qsl)
        for layer in range(c.layers):
            self.q[layer].copy_((torch.randn(P, c.heads, D_QK, generator=g) * 0.5).to(self.act))
            self.kv_new[layer].copy_(torch.randn(P, D_QK, generator=g).to(self.act))
            self.q_idx[layer].copy_(torch.randn(P, c.index_heads, INDEXER_DIM, generator=g).to(self.act))
            self.w_idx[layer].copy_(torch.randn(P, c.index_heads, generator=g) * (c.index_heads * INDEXER_DIM) ** -0.5)
            self.k_idx[layer].copy_(torch.randn(P, INDEXER_DIM, generator=g).to(self.act))
        self.host = {"seq_lens": lens.tolist(), "real": real, "block_table": table[:real]}
        self.build()

    # ---- the forward: what the graph captures ----

    def write_mla_rows(self, layer: int) -> None:
        """The new token's `[c_kv | k_pe]` row at its slot; slot -1 goes to the trash row (capture-safe stand-in
        for vLLM's `concat_and_cache_mla`, which skips it in the kernel)."""
        from glm5lib.kernels.naive import quantize_fp8_ds_mla

        bs, trash = self.case.block_size, self.mla_store[layer].shape[0] - 1
        s = self.slot_mapping
        rows = torch.where(s >= 0, (s // bs) * bs + s % bs, torch.full_like(s, trash))
        new = quantize_fp8_ds_mla(self.kv_new[layer]) if self.fp8 else self.kv_new[layer]
        self.mla_store[layer].index_copy_(0, rows, new)

    def layer(self, layer: int, pieces: tuple[str, ...] = ("mla_write", "index_write", "topk", "mla")) -> None:
        from glm5lib.vllm_plugin.paged import PagedBatch, decode_topk, sparse_mla_forward, write_indexer_keys

        c = self.case
        if "mla_write" in pieces:
            self.write_mla_rows(layer)
        if "index_write" in pieces:
            write_indexer_keys(self.idx_cache[layer], self.k_idx[layer], self.slot_mapping)
        if "topk" in pieces:
            decode_topk(self.q_idx[layer], self.w_idx[layer], self.idx_cache[layer], self.block_table, self.seq_lens,
                        self.token_lens, 1, c.topk, self.topk_buffer, self.logits)
            self.topk_out[layer].copy_(self.topk_buffer[: c.padded])
        if "mla" in pieces:
            batch = PagedBatch(self.req_id, self.block_table, c.block_size, c.topk)
            out, _ = sparse_mla_forward(self.q[layer], self.mla_cache[layer], batch, self.topk_buffer, GLM5.softmax_scale,
                                        c.kv_format, "triton")
            self.out[layer].copy_(out)

    def step(self) -> None:
        for layer in range(self.case.layers):
            self.layer(layer)

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.out + self.topk_out]

    def reference_out(self, layer: int) -> torch.Tensor:
        """The real requests' sparse-MLA output from this step's host-side block table (not the builders'
        buffers): rows by `paged.local_to_physical_rows`, attention by the fp32 `naive.sparse_mla_ref`."""
        from glm5lib.kernels.naive import sparse_mla_ref
        from glm5lib.vllm_plugin.paged import flat_kv_rows, local_to_physical_rows

        real = self.host["real"]
        kv_rows, stride = flat_kv_rows(self.mla_cache[layer], self.case.block_size)
        rows = local_to_physical_rows(torch.arange(real), self.host["block_table"], self.topk_out[layer][:real].cpu(),
                                      self.case.block_size, stride)
        fmt = "fp8_ds_mla" if self.fp8 else "fp32"
        out, _ = sparse_mla_ref(self.q[layer][:real].float().cpu(), kv_rows.cpu() if self.fp8 else kv_rows.float().cpu(),
                                rows, GLM5.softmax_scale, d_v=D_NOPE, kv_format=fmt)
        return out

    def per_request_topk(self, layer: int) -> torch.Tensor:
        """The real requests' top-k by the per-request path (`paged.step_topk`, one request at a time)."""
        from glm5lib.vllm_plugin.paged import step_topk

        real = self.host["real"]
        buf = torch.full((real, self.case.topk), -1, dtype=torch.int32, device=self.device)
        step_topk(self.q_idx[layer][:real], self.w_idx[layer][:real], self.idx_cache[layer], self.block_table[:real],
                  list(range(real + 1)), self.host["seq_lens"], self.case.topk, buf, seq_lens_dev=self.seq_lens[:real],
                  kernel="triton", batch_decodes=False)
        return buf


def _same_picks(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(torch.sort(a, 1).values, torch.sort(b, 1).values))


def host_us(fn, repeats: int) -> float:
    """Host time to issue one call, the GPU idle at the start of each (median, microseconds)."""
    ts = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    ts.sort()
    return ts[len(ts) // 2] * 1e6


def capture(fn, warmup: int = 2) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def prebound_eager(st: DecodeStep, g: torch.cuda.CUDAGraph, repeats: int) -> dict:
    """The eager layer with `kernels.common.Prebound` on (Triton's binder skipped after the first launch of a
    signature; the default on the Triton versions it was checked on): host time per layer, and the step's outputs
    against the same step launched the plain way and against the graph replay of the same metadata."""
    from glm5lib.kernels import common

    res, was = {}, common.PREBOUND
    try:
        st.new_step(st.case.batch)
        common.PREBOUND = False
        st.step()
        plain = st.snapshot()
        g.replay()
        replay = st.snapshot()
        common.PREBOUND = True
        st.step()  # registers each kernel's signature
        st.step()  # launches through the pre-bound launchers
        out = st.snapshot()
        res["prebound_equal"] = (all(torch.equal(a, b) for a, b in zip(out, plain))
                                 and all(torch.equal(a, b) for a, b in zip(out, replay)))
        res["eager_host_prebound_us"] = host_us(lambda: st.layer(0), repeats)
        res["eager_prebound_us"] = _events_us(st.step, repeats) / st.case.layers
    except Exception as exc:  # noqa: BLE001  (reported; the plain path's numbers stand)
        res["prebound_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        common.PREBOUND = was
    return res


def check_steps(st: DecodeStep, replay) -> dict:
    """Two steps with different metadata: `replay` (the graph, or None: the step eagerly on the refilled
    buffers) against a plain eager run of the same step, and the eager top-k against the per-request path."""
    res, c = {}, st.case
    for i, real in enumerate((c.batch, max(1, c.batch - 1) if c.batch > 1 else 1)):
        st.new_step(real)
        (replay or st.step)()
        got = st.snapshot()
        st.step()
        want = st.snapshot()
        res[f"step{i}_equal"] = all(torch.equal(a, b) for a, b in zip(got, want))
        res[f"step{i}_real"] = real
        # padding requests pick nothing and attend to nothing
        res[f"step{i}_padding_inert"] = all(bool((t[real:] == -1).all()) for t in st.topk_out) and \
            all(bool((o[real:] == 0).all()) for o in st.out)
        ref = st.per_request_topk(0)
        res[f"step{i}_same_picks_as_per_request"] = _same_picks(st.topk_out[0][:real].cpu(), ref.cpu())
        if st.device.type != "cuda":  # the interpreter computes in fp32: the output must match the fp32 reference
            err = float((st.out[0][:real].float().cpu() - st.reference_out(0)).abs().max())
            res[f"step{i}_max_abs_err_vs_reference"] = err
            res[f"step{i}_close_to_reference"] = err < 1e-3
    res["ok"] = all(v for k, v in res.items() if k.endswith(("_equal", "_inert", "_per_request", "_reference")))
    return res


def run_graph_case(case: GraphCase, device: torch.device, repeats: int, st: DecodeStep | None = None) -> dict:
    res = {"case": case.id, **asdict(case), "device": str(device)}
    st = st or DecodeStep(case, device)
    if device.type != "cuda":
        st.capture_metadata()
        st.step()  # zeroed capture metadata must run (and pick nothing)
        res["capture_metadata_inert"] = all(bool((t == -1).all()) for t in st.topk_out)
        res.update(check_steps(st, None))
        res["ok"] = res["ok"] and res["capture_metadata_inert"]
        return res
    st.capture_metadata()
    g = capture(st.step)
    res["capture_metadata_inert"] = all(bool((t == -1).all()) for t in st.topk_out)
    res.update(check_steps(st, g.replay))
    res["ok"] = res["ok"] and res["capture_metadata_inert"]
    if repeats <= 0:
        return res
    L = case.layers
    st.new_step(case.batch)
    res["graph_us"] = _events_us(g.replay, repeats) / L
    st.step()
    torch.cuda.synchronize()
    res["eager_us"] = _events_us(st.step, repeats) / L
    res["eager_host_us"] = host_us(lambda: st.layer(0), repeats)
    # the kernels' own GPU time: each piece of layer 0 captured alone, 10 launches per graph
    pieces = {}
    for name in ("mla_write", "index_write", "topk", "mla"):
        gp = capture(lambda n=name: [st.layer(0, (n,)) for _ in range(10)])
        pieces[name] = _events_us(gp.replay, max(3, repeats // 2)) / 10
        del gp
    res["pieces_us"] = pieces
    res["kernel_us"] = sum(pieces.values())
    res["graph_over_kernel"] = res["graph_us"] / res["kernel_us"]
    # the same scores at this step's longest context instead of max_model_len (the static width's cost)
    from glm5lib.kernels.indexer import indexer_logits
    from glm5lib.vllm_plugin.paged import indexer_q

    longest = max(st.host["seq_lens"])
    P = case.padded

    wide = torch.empty(P, GLM5.max_position_embeddings, dtype=torch.float32, device=device)

    def scores(width, bound):
        out = st.logits[:P] if width <= st.logits.shape[1] else wide
        return lambda: [indexer_logits(indexer_q(st.q_idx[0]), st.idx_cache[0], st.w_idx[0], k_format="fp8",
                                       block_table=st.block_table, context_lens=st.seq_lens, max_len=width,
                                       out=out, row_bound_only=bound) for _ in range(10)]

    # the scores alone: at this step's longest context (one program per tile, the eager per-step launch), at
    # max_model_len with the fixed looping grid (the graph path) and with one program per tile, and at GLM-5's
    # full 202752 positions with the looping grid (its cost must follow the contexts, not the width)
    for key, width, bound in (("indexer_scores_step_width_us", longest, False),
                              ("indexer_scores_static_width_us", case.max_model_len, True),
                              ("indexer_scores_static_width_per_tile_us", case.max_model_len, False),
                              ("indexer_scores_glm5_width_us", GLM5.max_position_embeddings, True)):
        gp = capture(scores(width, bound))
        res[key] = _events_us(gp.replay, max(3, repeats // 2)) / 10
    del wide
    del g, gp
    return res


# ---- glm5lib sparse_mla vs FlashMLA, eager at batch 1 ----------------------------------------------------------


def flashmla_path() -> Path | None:
    """The vLLM wheel's `_flashmla_C.abi3.so` in `.vendor/` (the working directory's, or the checkout's)."""
    from glm5lib.paths import repo_root

    for base in (Path.cwd(), repo_root()):
        if base is None:
            continue
        hits = sorted((base / ".vendor").glob("_flashmla_C.abi3.so"))
        if hits:
            return hits[0]
    return None


def load_flashmla() -> str | None:
    """Load FlashMLA's ops (`torch.ops._flashmla_C`) from the extension by file path (sys.path untouched; the
    same way as `glm5lib.bench`, which this floor does not import); None when they load, else why not."""
    import importlib.machinery
    import importlib.util
    import sys

    if hasattr(torch.ops._flashmla_C, "sparse_decode_fwd"):
        return None
    path = flashmla_path()
    if path is None:
        return "no .vendor/_flashmla_C.abi3.so"
    try:
        loader = importlib.machinery.ExtensionFileLoader("_flashmla_C", str(path))
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_flashmla_C", path,
                                                                                         loader=loader))
        loader.exec_module(module)
        sys.modules["_flashmla_C"] = module
        torch.ops._flashmla_C.sparse_decode_fwd  # noqa: B018
        return None
    except Exception as exc:  # noqa: BLE001  (reported in the JSON)
        return f"{type(exc).__name__}: {exc}"


@dataclass
class FlashCase:
    heads: int
    batch: int = 1
    ctx: int = 8192
    topk: int = GLM5.index_topk

    @property
    def id(self) -> str:
        return f"eager-vs-flashmla-H{self.heads}-B{self.batch}"


def run_flash_case(case: FlashCase, repeats: int, flash_error: str | None) -> dict:
    """fp8_ds_mla, one request per token: `sparse_mla` eager (back-to-back calls, and host time per call) and
    FlashMLA's `sparse_decode_fwd` the same way (heads padded to 64/128, as vLLM pads them)."""
    from glm5lib.kernels.mla import sparse_mla
    from glm5lib.kernels.naive import quantize_fp8_ds_mla

    B, H = case.batch, case.heads
    res = {"case": case.id, **asdict(case)}
    g = torch.Generator(device="cuda").manual_seed(3)
    kv = quantize_fp8_ds_mla(torch.randn(B * case.ctx, D_QK, device="cuda", generator=g, dtype=torch.bfloat16))
    q = torch.randn(B, H, D_QK, device="cuda", generator=g, dtype=torch.bfloat16)
    idx = (torch.rand(B, case.ctx, device="cuda", generator=g).argsort(dim=1)[:, : case.topk].to(torch.int32)
           + (torch.arange(B, device="cuda", dtype=torch.int32) * case.ctx)[:, None])
    call = lambda: sparse_mla(q, kv, idx, GLM5.softmax_scale, kv_format="fp8_ds_mla")  # noqa: E731
    call()
    res["glm5lib_eager_us"] = _events_us(call, repeats)
    res["glm5lib_host_us"] = host_us(call, repeats)
    gr = capture(call)
    res["glm5lib_graph_us"] = _events_us(gr.replay, repeats)
    if flash_error:
        res["flashmla_error"] = flash_error
        return res
    h_pad = 64 if H <= 64 else 128
    q4 = torch.zeros(B, 1, h_pad, D_QK, device="cuda", dtype=torch.bfloat16)
    q4[:, 0, :H] = q
    kv4 = kv.view(torch.float8_e4m3fn).view(-1, 64, 1, FP8_DS_MLA_ROW_BYTES) if (B * case.ctx) % 64 == 0 else None
    state = {"meta": None, "splits": None}

    def flash():
        out, lse, md, ns = torch.ops._flashmla_C.sparse_decode_fwd(
            q4, kv4, idx.unsqueeze(1), None, None, state["meta"], state["splits"], None, None, None, D_NOPE,
            GLM5.softmax_scale, None, False)
        state["meta"], state["splits"] = md, ns
        return out

    try:
        o = flash()
        ref = call()[0].float()
        res["flashmla_rel_err"] = float((o[:, 0, :H].float() - ref).norm() / ref.norm())
        res["flashmla_eager_us"] = _events_us(flash, repeats)
        res["flashmla_host_us"] = host_us(flash, repeats)
        res["glm5lib_over_flashmla_eager"] = res["glm5lib_eager_us"] / res["flashmla_eager_us"]
    except Exception as exc:  # noqa: BLE001
        res["flashmla_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return res


# ---- the run --------------------------------------------------------------------------------------------------


def prebound_cases() -> list[GraphCase]:
    return [GraphCase(16, fmt, 32, 32) for fmt in ("bf16", "fp8_ds_mla")]


def run_prebound_case(case: GraphCase, device: torch.device, repeats: int) -> dict:
    """The eager decode layer with and without `kernels.common.Prebound` (Triton's binder skipped after the first
    launch of a signature): host time per layer, and the outputs of both against the graph replay of the same
    step."""
    res = {"case": "prebound-" + case.id, **asdict(case), "device": str(device)}
    st = DecodeStep(case, device)
    st.capture_metadata()
    g = capture(st.step)
    from glm5lib.kernels import common, indexer, mla, rows, topk

    was, common.PREBOUND = common.PREBOUND, False  # the plain launch (the default on checked Tritons is pre-bound)
    try:
        st.new_step(case.batch)
        st.step()
        res["eager_host_us"] = host_us(lambda: st.layer(0), repeats)
    finally:
        common.PREBOUND = was
    res.update(prebound_eager(st, g, repeats))

    # a launcher that refused the direct call (another Triton calling convention) fell back to plain launches
    res["prebound_fell_back"] = {name: pb.broken for name, pb in (("sparse_mla", mla._FWD), ("merge", mla._MERGE),
                                                                   ("indexer", indexer._PAGED),
                                                                   ("topk", topk._SELECT), ("rows", rows._ROWS),
                                                                   ("key_write", rows._QWRITE)) if pb.broken}
    res["ok"] = bool(res.get("prebound_equal"))
    return res


def run(device: torch.device, repeats: int, tiny: bool, log=print, checkpoint=None) -> dict:
    """Every case (each in its own try/except); `checkpoint(report)` after each, so a crash keeps the rest."""
    results = []

    def report() -> dict:
        return {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "torch": torch.__version__, "mode": "graphs", "results": results, "summary": summarize(results)}

    def done(r: dict) -> None:
        results.append(r)
        log(format_line(r))
        if checkpoint is not None:
            checkpoint(report())

    cases = graph_cases(tiny)
    shared: dict = {}
    for case in cases:
        try:
            # caches depend on the format and batch, not the heads: build them once per (format, batch)
            key = (case.kv_format, case.padded)
            if shared.get("key") != key:
                shared.clear()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                base = DecodeStep(case, device)
                shared.update(key=key, base=base)
            st = shared["base"]
            if st.case.heads != case.heads:
                st.case = case
                st.q = [torch.zeros(case.padded, case.heads, D_QK, dtype=st.act, device=device)
                        for _ in range(case.layers)]
                st.out = [torch.zeros(case.padded, case.heads, D_NOPE, dtype=st.act, device=device)
                          for _ in range(case.layers)]
            r = run_graph_case(case, device, repeats, st)
        except Exception as exc:  # noqa: BLE001  (one failing case must not lose the others)
            r = {"case": case.id, **asdict(case), "ok": False,
                 "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        done(r)
    if device.type != "cuda":
        return report()
    shared.clear()
    torch.cuda.empty_cache()
    err = load_flashmla()
    for h in (8, 16, 64, 128):
        fc = FlashCase(h)
        try:
            r = run_flash_case(fc, repeats, err)
            r["ok"] = "glm5lib_eager_us" in r
        except Exception as exc:  # noqa: BLE001
            r = {"case": fc.id, **asdict(fc), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        done(r)
    for case in prebound_cases():
        try:
            r = run_prebound_case(case, device, repeats)
        except Exception as exc:  # noqa: BLE001
            r = {"case": "prebound-" + case.id, **asdict(case), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        done(r)
    return report()


def format_line(r: dict) -> str:
    head = f"{r['case']:<40} {'ok  ' if r.get('ok') else 'FAIL'}"
    if "error" in r:
        return f"{head} {r['error'][:160]}"
    if r["case"].startswith("prebound-"):
        return (f"{head} eager layer host time {r['eager_host_us']:.1f} us, pre-bound "
                f"{r.get('eager_host_prebound_us', float('nan')):.1f} us, same outputs {r.get('prebound_equal')}"
                + (f" ({r['prebound_error'][:80]})" if "prebound_error" in r else ""))
    if r["case"].startswith("graph-"):
        s = head + " " + " ".join(f"{k.replace('_equal', '')}={r[k]}" for k in r if k.endswith("_equal"))
        if "graph_us" in r:
            s += (f"  per layer: graph {r['graph_us']:.1f} us, kernels {r['kernel_us']:.1f} us "
                  f"(x{r['graph_over_kernel']:.2f}), eager {r['eager_us']:.1f} us, eager host {r['eager_host_us']:.1f} us")
        return s
    s = f"{head} sparse_mla eager {r['glm5lib_eager_us']:.1f} us (host {r['glm5lib_host_us']:.1f}, graph " \
        f"{r['glm5lib_graph_us']:.1f})"
    if "flashmla_eager_us" in r:
        s += f"  FlashMLA eager {r['flashmla_eager_us']:.1f} us (host {r['flashmla_host_us']:.1f})"
    elif "flashmla_error" in r:
        s += f"  FlashMLA: {r['flashmla_error'][:80]}"
    return s


def summarize(results: list[dict]) -> dict:
    graphs = [r for r in results if r["case"].startswith("graph-")]
    timed = [r for r in graphs if "graph_us" in r]
    out = {"graph_cases": len(graphs), "graph_cases_ok": sum(bool(r.get("ok")) for r in graphs),
           "replay_equals_eager": all(r.get("step0_equal") and r.get("step1_equal") for r in graphs)}
    if timed:
        out["graph_over_kernel_max"] = max(r["graph_over_kernel"] for r in timed)
        out["graph_within_1p1_of_kernel"] = sum(r["graph_over_kernel"] <= 1.1 for r in timed)
        out["timed"] = len(timed)
        out["eager_over_graph"] = [min(r["eager_us"] / r["graph_us"] for r in timed),
                                   max(r["eager_us"] / r["graph_us"] for r in timed)]
        wide = [r for r in timed if "indexer_scores_glm5_width_us" in r]
        if wide:  # the decode scores' cost at 202752 positions against max_model_len: should stay near 1
            out["indexer_scores_glm5_width_over_static_max"] = max(
                r["indexer_scores_glm5_width_us"] / r["indexer_scores_static_width_us"] for r in wide)
    pre = [r for r in results if "eager_host_prebound_us" in r]
    if pre:
        out["prebound_same_outputs"] = all(r["prebound_equal"] for r in pre)
        out["eager_host_us_plain_vs_prebound"] = {r["case"]: [r["eager_host_us"], r["eager_host_prebound_us"]]
                                                  for r in pre}
    flash = [r for r in results if "glm5lib_over_flashmla_eager" in r]
    if flash:
        out["sparse_mla_over_flashmla_eager_b1"] = {r["case"]: r["glm5lib_over_flashmla_eager"] for r in flash}

    return out


def weight_stream_ms(batch: int, tp: int = 8, bytes_per_param: float = 1.0, hbm_tb_s: float = 4.2,
                     c: GLM5Config = GLM5) -> float:
    """The rest of a GLM-5 decode step as a memory roofline: the weights one GPU of `tp` reads once per step
    (every layer's attention and indexer projections, dense FFNs, shared experts, the routed experts `batch`
    tokens touch in expectation, the LM head) at `hbm_tb_s`; fp8 weights by default. A lower bound of the
    non-attention time, so the attention share computed from it is an upper bound."""
    h, E, k = c.hidden_size, c.n_routed_experts, c.num_experts_per_tok
    attn = (h * c.q_lora_rank + c.q_lora_rank * c.num_attention_heads * c.qk_head_dim
            + h * (c.kv_lora_rank + c.qk_rope_head_dim)
            + c.kv_lora_rank * c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim)
            + c.num_attention_heads * c.v_head_dim * h
            + c.q_lora_rank * c.index_n_heads * c.index_head_dim + h * (c.index_head_dim + c.index_n_heads))
    expert = 3 * h * c.moe_intermediate_size
    touched = E * (1 - (1 - k / E) ** batch)  # distinct routed experts a batch of tokens reads, in expectation
    moe_layers = c.num_hidden_layers - c.first_k_dense_replace
    params = (c.num_hidden_layers * attn + c.first_k_dense_replace * 3 * h * c.intermediate_size
              + moe_layers * (c.n_shared_experts + touched) * expert + c.vocab_size * h)
    return params * bytes_per_param / tp / (hbm_tb_s * 1e12) * 1e3


def projected_attention_share(report: dict, layers: int = GLM5.num_hidden_layers, tp_of_heads: bool = True) -> list[dict]:
    """Per (heads, format, batch): a GLM-5 decode step's attention time (`layers` x the per-layer time) eager and
    from the graph, and the share of the step it takes next to `weight_stream_ms` (TP = 64 / heads per GPU)."""
    rows = []
    for r in report["results"]:
        if "graph_us" not in r:
            continue
        tp = max(1, GLM5.num_attention_heads // r["heads"]) if tp_of_heads else 8
        rest = weight_stream_ms(r["batch"], tp=tp)
        row = {"heads": r["heads"], "kv_format": r["kv_format"], "batch": r["batch"], "tp": tp,
               "eager_ms": layers * r["eager_us"] / 1e3, "graph_ms": layers * r["graph_us"] / 1e3,
               "rest_ms": rest}
        row["eager_share"] = row["eager_ms"] / (row["eager_ms"] + rest)
        row["graph_share"] = row["graph_ms"] / (row["graph_ms"] + rest)
        rows.append(row)
    return rows


def plot(report: dict):
    """Per case: eager layer, graph replay and the kernels' own time (us per layer, log scale)."""
    from glm5lib.plotting import pyplot

    plt = pyplot()
    timed = [r for r in report["results"] if "graph_us" in r]
    fig, ax = plt.subplots(figsize=(13, 4.2))
    x = range(len(timed))
    for i, (key, label) in enumerate([("eager_us", "eager layer (as vLLM runs prefill/first steps)"),
                                      ("graph_us", "CUDA-graph replay"), ("kernel_us", "kernels alone")]):
        ax.bar([j + (i - 1) * 0.27 for j in x], [r[key] for r in timed], 0.27, label=label)
    ax.set_xticks(list(x), [f"H{r['heads']} {'fp8' if r['kv_format'] == 'fp8_ds_mla' else 'bf16'} B{r['batch']}"
                            for r in timed], rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("us per layer")
    ax.set_title(f"GLM-5 decode layer (key writes, indexer, top-k, sparse MLA), {report['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
