"""The vLLM backend's per-step helpers that run glm5lib kernels (Triton interpreter here), each held to its
PyTorch twin: the one-launch local -> physical row conversion, the batched decode indexer step, the indexer key
writers, and `req_id_per_token` built on the device. No vLLM import here: `glm5lib.vllm_plugin.paged` is plain
PyTorch + glm5lib kernels."""

import pytest
import torch


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_local_to_physical_rows_against_a_loop(impl):
    from glm5lib.vllm_plugin.paged import physical_rows_for

    g = torch.Generator().manual_seed(0)
    bs, stride = 64, 80
    block_table = torch.randperm(40, generator=g)[:24].view(3, 8).to(torch.int32)
    req = torch.tensor([0, 1, 1, 2], dtype=torch.int32)
    topk = torch.randint(-1, 8 * bs, (4, 32), generator=g, dtype=torch.int32)
    topk[0, :3] = torch.tensor([-1, 8 * bs, 8 * bs + 5])  # padding and out-of-table positions
    convert = physical_rows_for("triton" if impl == "triton" else "naive")  # triton: the interpreter here
    got = convert(req, block_table, topk, bs, stride)
    assert got.dtype == torch.int32 and got.shape == topk.shape
    for t in range(4):
        for j in range(32):
            p = int(topk[t, j])
            want = -1 if p < 0 or p // bs >= 8 else int(block_table[req[t], p // bs]) * stride + p % bs
            assert int(got[t, j]) == want


def _step_inputs(seq_lens, query_lens, heads=4, topk=16, bs=16, seed=3):
    from glm5lib.vllm_plugin.paged import write_indexer_keys

    g = torch.Generator().manual_seed(seed)
    nblk = [-(-L // bs) for L in seq_lens]
    perm = torch.randperm(sum(nblk) + 2, generator=g)
    table = torch.zeros(len(seq_lens), max(nblk), dtype=torch.int32)
    cache = torch.zeros(sum(nblk) + 2, bs, 132, dtype=torch.uint8)
    k0 = 0
    for r, (L, nb) in enumerate(zip(seq_lens, nblk)):
        table[r, :nb] = perm[k0 : k0 + nb].to(torch.int32)
        k0 += nb
        pos = torch.arange(L)
        write_indexer_keys(cache, torch.randn(L, 128, generator=g), table[r, pos // bs].long() * bs + pos % bs)
    T = sum(query_lens)
    qsl = [0, *torch.tensor(query_lens).cumsum(0).tolist()]
    return torch.randn(T, heads, 128, generator=g), torch.randn(T, heads, generator=g) * 0.1, cache, table, qsl


@pytest.mark.parametrize("q_fp8", [False, True], ids=["q-fp32", "q-fp8"])
@pytest.mark.parametrize("query_lens", [(1, 1, 1, 1, 20), (2, 2, 2, 2, 1), (1, 3, 1)], ids=["decode+prefill", "mtp", "mixed"])
def test_step_topk_batches_the_leading_decodes(query_lens, q_fp8, monkeypatch):
    """One paged-indexer launch for the leading run of equal short query lengths, the same top-k as one request
    at a time, and the same as the PyTorch twin (fp32 under the interpreter: exact)."""
    import glm5lib.kernels.indexer as kidx
    from glm5lib.vllm_plugin.paged import step_topk

    seq_lens = [40, 9, 70, 33, 150][: len(query_lens)]
    q, w, cache, table, qsl = _step_inputs(seq_lens, query_lens)
    if q_fp8:  # as vLLM hands q to the indexer: e4m3, the per-(token, head) scale folded into the weights
        from glm5lib.kernels.naive import quantize_indexer_q

        q, q_scale = quantize_indexer_q(q)
        w = w * q_scale
    launches = []
    real = kidx.indexer_logits
    monkeypatch.setattr(kidx, "indexer_logits", lambda *a, **k: launches.append(a[0].shape[0]) or real(*a, **k))

    def run(kernel, batch):
        return step_topk(q, w, cache, table, qsl, seq_lens, 16, torch.full((qsl[-1] + 3, 16), 7, dtype=torch.int32),
                         kernel=kernel, batch_decodes=batch)

    batched = run("triton", True)
    n_batched = list(launches)
    launches.clear()
    loop = run("triton", False)
    lead = next(i for i, n in enumerate(query_lens) if n != query_lens[0])  # leading equal query lengths
    assert n_batched == [lead * query_lens[0]] + list(query_lens[lead:]) if lead >= 2 else n_batched == list(query_lens)
    assert launches == list(query_lens)
    assert torch.equal(batched, loop)
    naive = run("naive", False)  # descending score; the Triton select lists the same picks by position
    assert torch.equal(batched.sort(1).values, naive.sort(1).values)
    assert (batched[qsl[-1]:] == 7).all()  # rows past this step's tokens are left alone
    assert (batched[1, 9:] == -1).all() if query_lens[1] == 1 else True  # request of 9 keys: 9 picks, then -1


def test_req_id_per_token_on_the_device_matches_the_host_twin():
    from glm5lib.vllm_plugin.paged import StepBuffers, req_id_per_token

    bufs = StepBuffers(64, "cpu")

    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        lens = torch.randint(0, 6, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g)
        qsl = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
        n_tokens = int(qsl[-1]) + int(torch.randint(0, 3, (1,), generator=g))  # padding tokens past the last
        want = req_id_per_token(qsl.numpy(), n_tokens)
        bufs.req_id_per_token.fill_(99)  # stale values from an earlier step must be overwritten
        got = bufs.fill_req_ids(torch.cat([qsl, qsl[-1:].repeat(3)]), len(lens), n_tokens)  # padded qsl
        assert got.dtype == torch.int32 and torch.equal(got, want), (qsl.tolist(), got.tolist(), want.tolist())


def test_write_indexer_rows_matches_the_pytorch_writer():
    """The Triton scatter (CUDA's path) writes exactly the bytes the PyTorch writer writes, skips -1 slots,
    and leaves every other byte alone, with a block stride larger than the block (other layers' pages)."""
    from glm5lib.kernels.naive import quantize_indexer_k
    from glm5lib.kernels.rows import write_indexer_rows
    from glm5lib.vllm_plugin.paged import write_indexer_keys

    g = torch.Generator().manual_seed(6)
    nb, bs, row, pad = 5, 16, 132, 40
    storage_a = torch.randint(0, 255, (nb * (bs * row + pad),), generator=g, dtype=torch.uint8)
    storage_b = storage_a.clone()
    view = lambda st: st.as_strided((nb, bs, row), (bs * row + pad, row, 1))  # noqa: E731
    k = torch.randn(30, 128, generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:30].to(torch.int32)
    slots[[3, 17]] = -1
    write_indexer_keys(view(storage_a), k, slots)  # PyTorch (this machine has no GPU)
    write_indexer_rows(view(storage_b), quantize_indexer_k(k), slots)  # Triton, interpreter
    assert torch.equal(storage_a, storage_b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_write_indexer_keys_stores_what_the_reference_quantizes(dtype):
    """The one-launch quantize + scatter (sm_89+ on CUDA) against PyTorch's quantization, byte for byte, with the
    fp32 -> e4m3 cast done by Triton on both sides: Triton's interpreter rounds ~2 % of those casts differently
    from PyTorch and the hardware (seen: -126.4 -> -64 instead of -128), so the cast itself is held to PyTorch's
    on the H200 (the vLLM harness: identical bytes). Scales bit-equal; -1 slots and all other bytes untouched."""
    import triton
    import triton.language as tl

    from glm5lib.kernels.rows import quantize_write_indexer_keys
    from glm5lib.vllm_plugin.paged import write_indexer_keys_torch

    @triton.jit
    def cast_e4m3(X, O, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(O + o, tl.load(X + o).to(tl.float8e4nv).to(tl.uint8, bitcast=True))

    g = torch.Generator().manual_seed(8)
    nb, bs, row, pad = 4, 16, 132, 24
    base = torch.randint(0, 255, (nb * (bs * row + pad),), generator=g, dtype=torch.uint8)
    a, b = base.clone(), base.clone()
    view = lambda st: st.as_strided((nb, bs, row), (bs * row + pad, row, 1))  # noqa: E731
    k = (torch.randn(16, 128, generator=g) * 3).to(dtype)  # bf16: as the indexer op hands keys over on CUDA
    slots = torch.randperm(nb * bs, generator=g)[:16].to(torch.int32)
    slots[[2, 11]] = -1
    write_indexer_keys_torch(view(a), k, slots)  # PyTorch: scales and the cast's input
    kf = k.float()
    scale = torch.clamp_min(kf.abs().amax(-1), 1e-8) / 448
    cast = torch.empty(16 * 128, dtype=torch.uint8)
    cast_e4m3[(1,)]((kf / scale[:, None]).contiguous().view(-1), cast, N=16 * 128)
    want = a.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            blk, off = divmod(s, bs)
            o = blk * (bs * row + pad) + off * 128
            want[o : o + 128] = cast[t * 128 : (t + 1) * 128]
    quantize_write_indexer_keys(view(b), k, slots)
    assert torch.equal(b, want)


def test_the_paged_forward_tells_the_kernel_whether_tokens_share_rows(monkeypatch):
    """`sparse_mla_forward` passes `decode` (one query token a request: no two tokens gather the same request's rows)
    from the step's max_query_len (the backend's metadata), None where it is not known (the kernel infers it);
    `run_sparse_mla` hands it to `mla.sparse_mla`, whose fp8-cache key-warps rule reads it."""
    from types import SimpleNamespace

    from glm5lib.kernels import mla
    from glm5lib.vllm_plugin import paged

    seen = []
    monkeypatch.setattr(paged, "run_sparse_mla", lambda *a: seen.append(a[-1]) or (None, None))
    monkeypatch.setattr(paged, "physical_rows_for", lambda kernel: lambda *a: None)
    q, cache = torch.zeros(4, 8, 576), torch.zeros(2, 64, 656, dtype=torch.uint8)
    base = dict(req_id_per_token=torch.zeros(4, dtype=torch.int32), block_table=torch.zeros(1, 2, dtype=torch.int32),
                block_size=64, topk_tokens=16)
    for max_q in (1, 3, None):
        paged.sparse_mla_forward(q, cache, SimpleNamespace(**base, max_query_len=max_q),
                                 torch.zeros(4, 16, dtype=torch.int32), 0.1, "fp8_ds_mla", "triton")
    paged.sparse_mla_forward(q, cache, paged.PagedBatch(**base), torch.zeros(4, 16, dtype=torch.int32), 0.1,
                             "fp8_ds_mla", "triton")  # the harness's batch: not known
    assert seen == [True, False, None, None]
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(mla, "sparse_mla", lambda *a, **kw: calls.append(kw["decode"]) or (None, None))
    for decode in (True, None):
        paged.run_sparse_mla(q, cache.view(-1, 656), torch.zeros(4, 16, dtype=torch.int32), 0.1, "fp8_ds_mla",
                             "triton", decode)
    assert calls == [True, None]
