"""DSA indexer scores and top-k: Triton (interpreter on CPU) vs the fp32 reference, the reference vs vLLM's
formula written independently, cache codecs, and vLLM's top-k convention."""

from __future__ import annotations

import pytest
import torch

from glm5lib.kernels import checks, naive
from glm5lib.kernels.indexer import indexer_logits
from glm5lib.kernels.topk import topk_indices, topk_select

torch.set_num_threads(1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


@pytest.mark.parametrize("case", checks.indexer_cases("ci"), ids=lambda c: c.name)
def test_case_matrix(case):
    res = checks.run_indexer_case(case, DEVICE, DTYPE)
    assert res.ok, f"{res.name}: {res.notes} rel={res.rel:.2e}"


def test_reference_matches_vllm_formula():
    """vLLM's fp8_mqa_logits_torch: logits = sum_h relu(q_h . k * scale_k) * w_h, masked outside [ks, ke)."""
    gen = torch.Generator().manual_seed(3)
    M, H, N = 6, 4, 30
    q = torch.randn(M, H, 128, generator=gen)
    k = torch.randn(N, 128, generator=gen)
    w = torch.rand(M, H, generator=gen)
    ks = torch.tensor([0, 0, 5, 5, 10, 29])
    ke = torch.tensor([1, 2, 8, 30, 10, 30])
    rows = naive.quantize_indexer_k(k)
    k8 = rows[:, :128].view(torch.float8_e4m3fn).float()
    sc = rows[:, 128:].contiguous().view(torch.float32).reshape(-1)
    score = torch.einsum("mhd,nd->hmn", q, k8) * sc
    want = (score.relu() * w.T[:, :, None]).sum(0)
    pos = torch.arange(N)
    want = want.masked_fill(~((pos >= ks[:, None]) & (pos < ke[:, None])), float("-inf"))
    got = naive.indexer_logits_ref(q, rows, w, k_format="fp8", ks=ks, ke=ke)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    assert torch.allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


def test_paged_cache_is_vllm_block_split_layout():
    """[nb, bs, 132]: a block holds bs*128 value bytes, then bs fp32 scales (DeepGEMM/vLLM layout)."""
    k = torch.randn(10, 128)
    rows = naive.quantize_indexer_k(k)
    paged = naive.pack_indexer_cache_paged(rows, 4)
    assert paged.shape == (3, 4, 132)
    flat = paged.reshape(3, 4 * 132)
    assert torch.equal(flat[1, 128:256], rows[5, :128])  # token 5 = block 1, offset 1
    assert torch.equal(flat[1, 4 * 128 + 4: 4 * 128 + 8], rows[5, 128:])
    assert torch.allclose(naive.unpack_indexer_cache_paged(paged)[:10], naive.dequantize_indexer_k(rows))


def test_fp8_query_path():
    """q in float8_e4m3fn (scale folded into weights): fp8 x fp8 dot on the raw key bytes."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(5, 8, 128, generator=gen)
    w = torch.rand(5, 8, generator=gen)
    rows = naive.quantize_indexer_k(torch.randn(70, 128, generator=gen)).to(DEVICE)
    q8, amax = naive.quantize_indexer_q(q)
    q8 = q8.to(DEVICE)
    got = indexer_logits(q8, rows, (w * amax).to(DEVICE), k_format="fp8", scale=0.1)
    want = naive.indexer_logits_ref(q8.float(), rows, (w * amax).to(DEVICE), k_format="fp8", scale=0.1)
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_case_matrix_topk_check_rejects_wrong_picks():
    """checks.topk_is_exact, the case matrix's top-k verdict, from the definition (not torch.topk)."""
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(6, 40, generator=g)
    scores[2, 5:] = float("-inf")  # 5 finite keys < k: all of them, then -1
    ks = torch.tensor([0, 0, 0, 3, 3, 3], dtype=torch.int32)
    scores[3:, :3] = float("-inf")  # ragged rows: keys before ks belong to another request
    right = topk_indices(scores, 8, ks=ks)
    assert checks.topk_is_exact(scores, right, 8, ks=ks)
    shifted = topk_indices(scores, 8)  # positions not made relative to ks
    assert not checks.topk_is_exact(scores, shifted, 8, ks=ks)
    lower = right.clone()
    worst = scores[0].argmin().item()
    lower[0, 0] = worst  # a picked key swapped for the lowest-scoring one
    assert not checks.topk_is_exact(scores, lower, 8, ks=ks)
    twice = right.clone()
    twice[1, 1] = twice[1, 0]
    assert not checks.topk_is_exact(scores, twice, 8, ks=ks)
    assert not checks.topk_is_exact(scores, torch.zeros_like(right), 8, ks=ks)  # a constant answer
    padded = right.clone()
    padded[2, 4] = -1  # one finite key left out
    assert not checks.topk_is_exact(scores, padded, 8, ks=ks)


def test_topk_convention():
    logits = torch.tensor([[0.5, float("-inf"), 2.0, 1.0, float("-inf")],
                           [float("-inf")] * 5,
                           [3.0, 2.0, 1.0, 0.0, -1.0]])
    ks = torch.tensor([0, 0, 2])
    got = topk_indices(logits, 4, ks=ks)
    assert got.dtype == torch.int32 and got.shape == (3, 4)
    assert set(got[0].tolist()) == {2, 3, 0, -1}
    assert got[1].tolist() == [-1, -1, -1, -1]
    assert set(got[2].tolist()) == {-2, -1, 0, 1}  # positions relative to ks = 2 (here: -2, -1 are rows 0, 1)
    wide = topk_indices(logits[:, :3], 8)
    assert wide.shape == (3, 8) and torch.all(wide[:, 3:] == -1)


def _stable_picks(x: torch.Tensor, k: int, lengths=None, ks=None) -> list[list[int]]:
    """Independent: per row, sort (score desc, position asc) over the finite scores before its length; the first k."""
    out = []
    for t in range(x.shape[0]):
        n = x.shape[1] if lengths is None else min(int(lengths[t]), x.shape[1])
        cand = [s for s in range(n) if x[t, s] != float("-inf")]
        cand.sort(key=lambda s: (-float(x[t, s]), s))
        base = 0 if ks is None else int(ks[t])
        out.append(sorted(s - base for s in cand[:k]))
    return out


# `topk_select`'s keyword arguments: the shipped select; blocks of 512 scores (rows of 1500-3000 over several); the
# row split over programs for every pass (`multi`), with chunks of one block and of several blocks of 256; each of
# the one-program and the multi select with the passes after the first counted by atomics in every block
# (`sparse=1`) and by `tl.histogram` in every block (`sparse=0`); the write's prefix sums over rows of 16 or 4
# adjacent keys (`scan_rows`: `topk.SELECT_SCAN_ROWS`), in both selects; every pass counted into global memory as
# the warp-aggregated adds do, or from the second pass on, or in the first pass's first block only where its adds
# were many (`agg` 1, 2, 3: `topk.SELECT_AGG`; the interpreter adds key by key, so 3 switches after a first block
# there), or not at all (0)
SELECT_VARIANTS = {"shipped": {}, "block512": {"config": (512, 4, 8)}, "multi": {"multi": True, "chunk": 700},
                   "multi-blocks": {"multi": True, "chunk": 600, "config": (256, 4, 8)},
                   "atomics": {"sparse": 1, "config": (512, 4, 8)}, "histograms": {"sparse": 0},
                   "multi-atomics": {"multi": True, "chunk": 700, "sparse": 1},
                   "multi-histograms": {"multi": True, "chunk": 600, "config": (256, 4, 8), "sparse": 0},
                   "rows16": {"scan_rows": 16}, "rows16-block256": {"scan_rows": 16, "config": (256, 4, 8)},
                   "rows4-atomics": {"scan_rows": 4, "sparse": 1, "config": (512, 4, 8)},
                   "multi-rows16": {"multi": True, "chunk": 600, "config": (256, 4, 8), "scan_rows": 16},
                   "agg0": {"agg": 0, "config": (512, 4, 8)}, "agg1": {"agg": 1, "config": (512, 4, 8)},
                   "agg2": {"agg": 2}, "agg3": {"agg": 3, "config": (512, 4, 8)}}


@pytest.mark.parametrize("variant", SELECT_VARIANTS)
@pytest.mark.parametrize("case", ["ties", "signed-zeros", "lengths-ks", "short-rows", "one-block"])
def test_topk_select_picks_like_a_stable_sort(monkeypatch, case, variant):
    """The Triton radix select: exactly the stable descending sort's picks (ties to the earlier position, -0.0
    tying with +0.0), listed in ascending position, -1 padded; row lengths and ks honoured; over one block or
    several, and with the row split over programs for every pass (`topk.SELECT_MULTI`: digit counts summed across
    programs, picks placed by the counts before)."""
    import glm5lib.kernels.topk as topk

    g = torch.Generator().manual_seed(7)
    lengths = ks = None
    if case == "ties":  # few distinct values: the cut falls inside a run of equal scores
        x = torch.randint(-4, 5, (5, 2600), generator=g).float()
        x[x < -2] = float("-inf")
        k = 700
    elif case == "signed-zeros":  # w * relu(.) gives -0.0 for negative head weights
        x = torch.zeros(3, 3000)
        x[:, ::3] = -0.0
        x[:, 2000:] = torch.rand(3, 1000, generator=g) + 0.1
        k = 1500
    elif case == "lengths-ks":
        x = torch.randn(6, 1500, generator=g)
        lengths = torch.tensor([1500, 10, 0, 777, 1499, 64], dtype=torch.int32)
        ks = torch.tensor([0, 3, 0, 100, 7, 1], dtype=torch.int32)
        k = 64
    elif case == "short-rows":  # fewer finite scores than k: all of them, then -1
        x = torch.full((3, 900), float("-inf"))
        x[0, :50] = torch.randn(50, generator=g)
        x[2] = torch.randn(900, generator=g)
        k = 2048
    else:
        x = torch.randn(40, 100, generator=g)
        k = 16
    kw = dict(SELECT_VARIANTS[variant])
    if "scan_rows" in kw:
        monkeypatch.setattr(topk, "SELECT_SCAN_ROWS", kw.pop("scan_rows"))
    if "agg" in kw:
        monkeypatch.setattr(topk, "SELECT_AGG", kw.pop("agg"))
    got = topk_select(x, k, lengths=lengths, ks=ks, **kw)
    assert got.shape == (x.shape[0], k) and got.dtype == torch.int32
    for t, want in enumerate(_stable_picks(x, k, lengths, ks)):
        row = got[t].tolist()
        assert row[: len(want)] == want, (case, t)  # same picks, ascending
        assert all(v == -1 for v in row[len(want):])


@pytest.mark.parametrize("scan_rows", [0, 16])
def test_topk_select_ties_running_out_at_a_block_edge(monkeypatch, scan_rows):
    """Ties at the threshold that run out exactly at the end of a block (64 keys of 1.0 taken, 64 more in the next
    block, none of them taken) or at the end of a row of the write's block (`topk.SELECT_SCAN_ROWS`: row 1 has one
    key above, so 63 ties are taken): the earliest k and nothing after, for the one-program select and the multi
    select, with a 1-D scan or one over rows."""
    import glm5lib.kernels.topk as topk

    monkeypatch.setattr(topk, "SELECT_SCAN_ROWS", scan_rows)
    x = torch.full((2, 256), 0.5)
    x[:, :128] = 1.0
    x[1, 200] = 2.0  # one key above: 63 of the ties taken, running out inside the first block
    for kw in ({"config": (64, 4, 8)}, {"multi": True, "chunk": 64, "config": (64, 4, 8)}):
        out = torch.full((2, 128), -5, dtype=torch.int32)  # wider than k: a pick past the k-th would land here
        topk.topk_select(x, 64, out=out, **kw)
        assert out[0, :64].tolist() == list(range(64)) and out[1, :64].tolist() == list(range(63)) + [200], kw
        assert bool((out[:, 64:] == -5).all()), kw


def _chunk_picks_unmerged(x, k, chunk, lengths=None, ks=None) -> list[list[int]]:
    """What a split select would give if its second launch passed the chunks' picks through unmerged: each
    chunk's stable top-k concatenated, the first k kept."""
    out = []
    for t in range(x.shape[0]):
        n = x.shape[1] if lengths is None else min(int(lengths[t]), x.shape[1])
        base = 0 if ks is None else int(ks[t])
        cands = []
        for c0 in range(0, n, chunk):
            part = [s for s in range(c0, min(c0 + chunk, n)) if x[t, s] != float("-inf")]
            part.sort(key=lambda s: (-float(x[t, s]), s))
            cands += sorted(part[:k])
        out.append([s - base for s in cands[:k]])
    return out


@pytest.mark.parametrize("block", [None, 64])
@pytest.mark.parametrize("case", ["ties-across-chunks", "relu-zero-rows", "lengths-mid-chunk", "short-rows",
                                  "k-over-chunk"])
def test_topk_select_split_rows_pick_like_one_program(monkeypatch, case, block):
    """Rows split into chunks (one program each) and merged by a second launch: exactly the one-program output
    and the stable sort's picks, whatever the chunk boundaries cut (runs of equal scores, -inf, row lengths); so
    too with the write's prefix sums over rows of 16 keys (`topk.SELECT_SCAN_ROWS`)."""
    import glm5lib.kernels.topk as topk

    g = torch.Generator().manual_seed(11)
    lengths = ks = None
    if case == "ties-across-chunks":  # 3 finite values: every chunk boundary falls inside a run of ties
        x = torch.randint(-3, 3, (4, 900), generator=g).float()
        x[x < -1] = float("-inf")
        k, chunk = 150, 128
    elif case == "relu-zero-rows":  # all-zero rows (+0.0 and -0.0) and a row with a few positives among zeros
        x = torch.zeros(3, 700)
        x[:, 1::2] = -0.0
        x[2, torch.randint(0, 700, (20,), generator=g)] = torch.rand(20, generator=g) + 0.5
        k, chunk = 100, 96
    elif case == "lengths-mid-chunk":
        x = torch.randn(6, 1000, generator=g)
        x[:, 300:340] = float("-inf")
        lengths = torch.tensor([1000, 37, 0, 450, 129, 2000], dtype=torch.int32)
        ks = torch.tensor([0, 3, 0, 100, 7, 1], dtype=torch.int32)
        k, chunk = 40, 100
    elif case == "short-rows":  # fewer finite scores than k: all of them, then -1
        x = torch.full((3, 800), float("-inf"))
        x[0, torch.randint(0, 800, (60,), generator=g)] = torch.randn(60, generator=g)
        x[2] = torch.randint(-2, 2, (800,), generator=g).float()
        k, chunk = 500, 128
    else:  # k larger than a chunk: each chunk passes all its finite scores on
        x = torch.randint(-2, 3, (2, 600), generator=g).float()
        x[:, ::7] = float("-inf")
        k, chunk = 250, 64
    want = _stable_picks(x, k, lengths, ks)
    if case != "short-rows":  # the case tells a merge from the chunks' picks passed through
        assert want != _chunk_picks_unmerged(x, k, chunk, lengths, ks)
    one = topk_select(x, k, lengths=lengths, ks=ks, chunk=x.shape[1])
    grids = []

    class Spy:
        def __call__(self, grid, *args, **kw):
            grids.append(tuple(grid))
            return prebound(grid, *args, **kw)

    prebound = topk._SELECT
    monkeypatch.setattr(topk, "_SELECT", Spy())
    got = topk_select(x, k, lengths=lengths, ks=ks, chunk=chunk, config=None if block is None else (block, 4, 8))
    assert grids == [(x.shape[0], -(-x.shape[1] // chunk)), (x.shape[0],)]  # the split path ran
    assert torch.equal(got, one), case
    for t, w in enumerate(want):
        row = got[t].tolist()
        assert row[: len(w)] == w, (case, t)  # same picks, ascending
        assert all(v == -1 for v in row[len(w):])
    # the row split over programs for every pass (`multi`), at the same chunk boundaries
    assert torch.equal(topk_select(x, k, lengths=lengths, ks=ks, chunk=chunk, multi=True), one), case
    # the write's prefix sums over rows of adjacent keys, in the split, the merge and the multi select; and every
    # pass counted into global memory (`topk.SELECT_AGG`)
    monkeypatch.setattr(topk, "SELECT_SCAN_ROWS", 16)
    for agg, kw in ((0, {"sparse": 1}), (1, {}), (2, {}), (3, {}), (0, {"multi": True})):  # multi takes no adds
        monkeypatch.setattr(topk, "SELECT_AGG", agg)
        got = topk_select(x, k, lengths=lengths, ks=ks, chunk=chunk, config=None if block is None else (block, 4, 8),
                          **kw)
        assert torch.equal(got, one), (case, kw, agg)


def test_topk_select_splits_long_rows_by_default(monkeypatch):
    """`topk_select` splits rows longer than SELECT_MAX_N without being asked, shorter rows one program each;
    `topk_fast` takes the split select past SELECT_MAX_N up to TOPK_FAST_TORCH_ABOVE scores, torch.topk beyond."""
    import glm5lib.kernels.topk as topk

    grids = []
    prebound = topk._SELECT
    monkeypatch.setattr(topk, "_SELECT", lambda grid, *a, **kw: (grids.append(tuple(grid)), prebound(grid, *a, **kw)))
    monkeypatch.setattr(topk, "SELECT_MAX_N", 256)
    monkeypatch.setattr(topk, "SELECT_CHUNK", 100)
    x = torch.randint(-2, 3, (2, 300), generator=torch.Generator().manual_seed(5)).float()
    got = topk.topk_select(x, 50)
    assert grids == [(2, 3), (2,)]
    assert [r.tolist() for r in got] == _stable_picks(x, 50)
    grids.clear()
    topk.topk_select(x[:, :256], 50)
    assert grids == [(2,)]
    grids.clear()
    assert [r.tolist() for r in topk.topk_fast(x, 50)] == _stable_picks(x, 50)  # few scores: the split select
    assert grids == [(2, 3), (2,)]
    grids.clear()
    monkeypatch.setattr(topk, "TOPK_FAST_TORCH_ABOVE", 599)  # 2 x 300 scores: torch.topk
    fast = topk.topk_fast(x, 50)
    assert grids == []
    assert sorted(fast[0].tolist()) == sorted(topk.topk_indices(x, 50)[0].tolist())
    topk.topk_fast(x[:, :256], 50)  # rows up to SELECT_MAX_N: the select whatever the count
    assert grids == [(2,)]
    with pytest.raises(ValueError):
        topk.topk_select(x, 50, chunk=0)


def test_topk_select_scan_rows_and_bad_input(monkeypatch):
    """`topk.scan_rows`: SELECT_SCAN_ROWS where a block holds at least two such rows, else the 1-D scan (0); each
    launch gets it for its own block (the split's and the merge's blocks differ); a negative `sparse` is refused."""
    import glm5lib.kernels.topk as topk

    monkeypatch.setattr(topk, "SELECT_SCAN_ROWS", 16)
    assert [topk.scan_rows(b) for b in (4096, 32, 16, 8)] == [16, 16, 0, 0]
    launches = []
    prebound = topk._SELECT
    monkeypatch.setattr(topk, "_SELECT", lambda grid, *a, **kw: (
        launches.append((tuple(grid), kw["BLOCK"], kw["ROWS"])), prebound(grid, *a, **kw)))
    x = torch.randn(3, 700, generator=torch.Generator().manual_seed(2))
    got = topk.topk_select(x, 8, chunk=24, config=(64, 4, 8))  # split blocks of 32 keys, the merge's of 64
    assert [r.tolist() for r in got] == _stable_picks(x, 8)
    assert launches == [((3, 30), 32, 16), ((3,), 64, 16)]
    launches.clear()
    topk.topk_select(x, 8, chunk=12, config=(64, 4, 8))  # split blocks of 16 keys: one row, the 1-D scan
    assert launches == [((3, 59), 16, 0), ((3,), 64, 16)]
    monkeypatch.setattr(topk, "SELECT_SCAN_ROWS", 0)
    assert topk.scan_rows(4096) == 0
    with pytest.raises(ValueError, match="sparse"):
        topk.topk_select(x, 64, sparse=-1)
    for bad in ((32768, 8, 8), (3000, 8, 8), (4096, 6, 8), (4096, 8, 0)):
        with pytest.raises(ValueError, match="config must be"):
            topk.topk_select(x, 64, config=bad)


def test_topk_ordered_keys_sort_like_the_scores():
    """`topk.ordered_keys` (the host twin of the kernels' `_ordered_key`): unsigned 32-bit keys in the scores'
    order, -0.0 and +0.0 one key, -inf below every finite score."""
    import glm5lib.kernels.topk as topk

    x = torch.tensor([float("-inf"), -3e38, -1.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 3e38])
    keys = topk.ordered_keys(x).tolist()
    assert keys[4] == keys[5] == 2**31 and all(0 <= k < 2**32 for k in keys)
    assert keys[:5] == sorted(set(keys[:5])) and keys[5:] == sorted(set(keys[5:]))
    y = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 10.0 ** torch.randint(-20, 20, (1000,)).float()
    assert torch.equal(torch.argsort(topk.ordered_keys(y), stable=True), torch.argsort(y, stable=True))


@pytest.mark.parametrize("scores", ["few-digits", "many-digits"])
def test_topk_select_first_pass_adds_or_switches(monkeypatch, scores):
    """`topk.SELECT_AGG` 3 goes on by warp-aggregated adds after a first block that took at most one add for two keys
    (few distinct first digits among 32 adjacent keys, the interpreter's warp), else by `tl.histogram`: on scores on
    either side of that (their first block's adds a key checked here) the picks are the stable sort's, as with every
    pass by adds (1) and by histogram (0), for one program a row and for split rows and their merge. Blocks with
    fewer keys than a program's threads take no adds (each warp holding a copy would add)."""
    import glm5lib.kernels.topk as topk

    g = torch.Generator().manual_seed(12)
    if scores == "few-digits":
        x = torch.randint(-2, 3, (3, 1800), generator=g).float() * 1.5
    else:
        bits = torch.randint(-2**31, 2**31, (3, 1800), generator=g, dtype=torch.int64).to(torch.int32)
        x = bits.view(torch.float32)
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    groups = (topk.ordered_keys(x[:, :512]) >> 24).reshape(3, 16, 32)
    adds = [sum(len(set(gr.tolist())) for gr in row) / 512 for row in groups]  # the first block's adds a key
    assert all(a <= 0.5 for a in adds) if scores == "few-digits" else all(a > 0.5 for a in adds)
    want = _stable_picks(x, 300)
    launches = []
    prebound = topk._SELECT
    monkeypatch.setattr(topk, "_SELECT", lambda grid, *a, **kw: (launches.append(kw["AGG"]), prebound(grid, *a, **kw)))
    for agg in (3, 1, 0):
        monkeypatch.setattr(topk, "SELECT_AGG", agg)
        assert [r.tolist() for r in topk.topk_select(x, 300, config=(512, 4, 8))] == want, agg
        assert [r.tolist() for r in topk.topk_select(x, 300, config=(512, 4, 8), chunk=600)] == want, agg  # split
    assert launches == [3, 3, 3, 1, 1, 1, 0, 0, 0]
    launches.clear()
    monkeypatch.setattr(topk, "SELECT_AGG", 3)
    assert [r.tolist() for r in topk.topk_select(x, 300, config=(64, 4, 8))] == want  # 64 keys on 128 threads
    assert launches == [0]


def test_topk_select_takes_the_wave_config_where_programs_fit_one_wave(monkeypatch):
    """`topk.select_config`: a launch of at most one program an SM takes SELECT_CONFIG_WAVE (more warps a program),
    a larger one SELECT_CONFIG, each launch of the split path on its own program count (the split's T x chunks, the
    merge's T); an explicit `config` takes every launch; the picks are the stable sort's either way."""
    import glm5lib.kernels.common as common
    import glm5lib.kernels.topk as topk

    assert topk.select_config(132, 132) == topk.SELECT_CONFIG_WAVE and topk.select_config(133, 132) == \
        topk.SELECT_CONFIG
    assert topk.SELECT_CONFIG_WAVE[2] == topk.SELECT_CONFIG[2]  # one digit width: the counts' workspace is shared
    monkeypatch.setattr(topk, "SELECT_CONFIG", (256, 4, 8))
    monkeypatch.setattr(topk, "SELECT_CONFIG_WAVE", (512, 8, 8))
    launches = []
    prebound = topk._SELECT
    monkeypatch.setattr(topk, "_SELECT", lambda grid, *a, **kw: (launches.append((tuple(grid), kw["BLOCK"],
                                                                                  kw["num_warps"])),
                                                                  prebound(grid, *a, **kw)))
    x = torch.randn(3, 1500, generator=torch.Generator().manual_seed(6))
    want = _stable_picks(x, 40)

    def run(sms, **kw):
        launches.clear()
        monkeypatch.setattr(common, "num_sms", lambda device: sms)
        assert [r.tolist() for r in topk.topk_select(x, 40, **kw)] == want
        return list(launches)

    assert run(3) == [((3,), 512, 8)]  # 3 rows, 3 SMs: one wave
    assert run(2) == [((3,), 256, 4)]
    assert run(9, chunk=500) == [((3, 3), 512, 8), ((3,), 128, 8)]  # the merge's 120 candidates: a 128 block
    assert run(8, chunk=500) == [((3, 3), 256, 4), ((3,), 128, 8)]  # 9 split programs on 8 SMs
    assert run(3, chunk=500, config=(64, 2, 8)) == [((3, 3), 64, 2), ((3,), 64, 2)]


def test_topk_select_rule_splits_a_captured_decode_steps_rows_over_programs(monkeypatch):
    """`topk._multi_default`: on a GPU, for `multi_rule`'s shapes (rows at least MULTI_MIN_N wide, at most
    MULTI_MAX_SCORES scores in the call, MULTI_MAX_SCORES_LONG past SELECT_MAX_N), the row split over programs for
    every pass (7 launches of `_multi_select_kernel` over [T, ceil(N / multi_chunk)]) while a CUDA graph is
    captured, and eagerly only the first call of each shape (its kernels loaded before any capture); more scores, a
    given `chunk`, or SELECT_MULTI False keep the one-program / split select; the picks are the stable sort's either
    way. `multi_chunk`: T * N / 256 rounded up to a power of two within MULTI_CHUNKS_RANGE."""
    import glm5lib.kernels.topk as topk

    grids = {"multi": [], "select": []}
    pre_multi, pre_select = topk._MULTI, topk._SELECT
    monkeypatch.setattr(topk, "_MULTI", lambda grid, *a, **kw: (grids["multi"].append(tuple(grid)),
                                                                pre_multi(grid, *a, **kw)))
    monkeypatch.setattr(topk, "_SELECT", lambda grid, *a, **kw: (grids["select"].append(tuple(grid)),
                                                                  pre_select(grid, *a, **kw)))
    capturing = [True]
    monkeypatch.setattr(topk, "capturing", lambda device: capturing[0])
    monkeypatch.setattr(topk, "_on_gpu", lambda device: True)  # the interpreter's tensors stand in for a GPU's
    monkeypatch.setattr(topk, "_MULTI_WARMED", set())
    monkeypatch.setattr(topk, "MULTI_MIN_N", 256)
    monkeypatch.setattr(topk, "SELECT_MAX_N", 256)
    monkeypatch.setattr(topk, "MULTI_MAX_SCORES_LONG", 600)
    monkeypatch.setattr(topk, "MULTI_CHUNKS_RANGE", (64, 128))
    x = torch.randint(-3, 4, (3, 300), generator=torch.Generator().manual_seed(9)).float()
    lengths = torch.tensor([300, 130, 7], dtype=torch.int32)

    def run(xs, **kw):
        for g in grids.values():
            g.clear()
        got = topk.topk_select(xs, 40, lengths=lengths[:xs.shape[0]], **kw)
        want = _stable_picks(xs, 40, lengths[:xs.shape[0]])
        assert [r.tolist()[: len(w)] for r, w in zip(got, want)] == want
        return {k: list(v) for k, v in grids.items()}

    assert topk.multi_rule(2, 300) and not topk.multi_rule(3, 300) and not topk.multi_rule(1, 255)
    assert [topk.multi_chunk(T, 300) for T in (1, 2, 3)] == [64, 64, 64]
    monkeypatch.setattr(topk, "MULTI_CHUNKS_RANGE", (1024, 8192))
    assert [topk.multi_chunk(T, 202752) for T in (1, 4, 16, 64)] == [1024, 4096, 8192, 8192]
    assert topk.multi_chunk(1, 32768) == 1024 and topk.multi_chunk(32, 32768) == 4096
    monkeypatch.setattr(topk, "MULTI_CHUNKS_RANGE", (64, 128))
    multi2, select2 = {"multi": [(2, 5)] * 6, "select": []}, {"multi": [], "select": [(2,)]}
    assert run(x[:2]) == multi2  # captured: 4 passes, count, write (the zeroing is torch's)
    assert run(x[:2]) == multi2  # every captured call
    assert run(x) == {"multi": [], "select": [(3,)]}  # 900 scores: the select (one SELECT_CHUNK, one program)
    assert run(x[:2], chunk=300) == select2  # a chunk asked for: the select it names
    capturing[0] = False
    assert run(x[:1]) == {"multi": [(1, 5)] * 6, "select": []}  # eager: a shape's first call loads the kernels
    assert run(x[:1]) == {"multi": [], "select": [(1,)]}  # then the select, fewer launches for the host
    assert run(x[:2]) == multi2 and run(x[:2]) == select2
    monkeypatch.setattr(topk, "SELECT_MULTI", True)
    assert run(x) == {"multi": [(3, 5)] * 6, "select": []}
    monkeypatch.setattr(topk, "SELECT_MULTI", False)
    capturing[0] = True
    assert run(x[:2]) == select2
    monkeypatch.setattr(topk, "SELECT_MULTI", None)
    monkeypatch.setattr(topk, "_on_gpu", lambda device: False)  # on the CPU: the select whatever the shape
    assert run(x[:2]) == select2


def test_topk_select_multi_edges_match_one_program():
    """The row split over programs (`multi=True`) where there is little to split: no columns, rows of -inf only,
    k larger than the row, rows shorter than one chunk, lengths past the row: the one-program output each time."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 50, generator=g)
    x[1] = float("-inf")
    x[2, ::2] = float("-inf")
    lengths = torch.tensor([50, 50, 9, 70], dtype=torch.int32)
    ks = torch.tensor([0, 2, 1, 5], dtype=torch.int32)
    for k in (3, 40, 64):
        for chunk in (7, 16, 64):
            one = topk_select(x, k, lengths=lengths, ks=ks, chunk=50)
            assert torch.equal(topk_select(x, k, lengths=lengths, ks=ks, chunk=chunk, multi=True), one), (k, chunk)
    assert torch.equal(topk_select(torch.empty(2, 0), 4, multi=True), torch.full((2, 4), -1, dtype=torch.int32))


def test_case_matrix_fp8_q_cases_run_with_software_e4m3(monkeypatch):
    """Where e4m3 is converted in software (sm_80, GLM5LIB_FP8_SOFTWARE=1) the fp8-q cases widen q the way
    vLLM's path does instead of stopping the matrix (the kernel refuses fp8 q there)."""
    from glm5lib.kernels import common

    monkeypatch.setattr(common, "FP8_SOFTWARE", True)
    cases = [c for c in checks.indexer_cases("ci") if c.q_fp8]
    assert cases
    for case in cases:
        res = checks.run_indexer_case(case, DEVICE, DTYPE)
        assert res.ok and "fp8 q widened (software e4m3)" in res.notes, res.name


def test_validation():
    q = torch.randn(2, 4, 128)
    with pytest.raises(ValueError):
        indexer_logits(q, torch.randn(5, 64), torch.rand(2, 4))
    with pytest.raises(ValueError):
        indexer_logits(q, torch.randn(5, 128), torch.rand(2, 3))
    with pytest.raises(ValueError):
        indexer_logits(q, torch.zeros(5, 130, dtype=torch.uint8), torch.rand(2, 4), k_format="fp8")


@pytest.mark.parametrize("q_fp8", [False, True], ids=["q-float", "q-fp8"])
@pytest.mark.parametrize("programs", [1, 12, 64])
def test_paged_row_bound_only_fixed_grid(monkeypatch, programs, q_fp8):
    """`row_bound_only` (the CUDA-graph decode launch, rows as wide as max_model_len): the same scores as the
    per-tile launch within each request's context, -inf up to the end of the tile holding it, nothing written
    after that tile, whether one program loops over a whole row (1 per SM), two share a row's tiles by stride (12
    for 10 queries) or each takes one tile (64). Contexts end in tiles 0-2, one is longer than the row, and a query
    whose position ends a tile has the next tile of its context written -inf (the tile loop's second loop)."""
    import glm5lib.kernels.indexer as ix

    monkeypatch.setattr(ix, "num_sms", lambda device: 1)
    monkeypatch.setattr(ix, "PAGED_LOOP_PROGRAMS_PER_SM", programs)
    g = torch.Generator().manual_seed(2)
    bs, nb, HI, n, R = 16, 200, 4, 2, 5
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(torch.randn(nb * bs, 128, generator=g)), bs)
    table = torch.randperm(nb, generator=g)[:R * 40].view(R, 40).to(torch.int32)
    # a padding request (context 0) in the middle; 129: the first query's position ends tile 0, so its tile 1 is
    # -inf after the loop; 700: longer than the row
    ctx = torch.tensor([300, 0, 140, 129, 700], dtype=torch.int32)
    q = torch.randn(R * n, HI, 128, generator=g).to(DTYPE)
    w = torch.randn(R * n, HI, generator=g)
    if q_fp8:
        q, amax = naive.quantize_indexer_q(q.float())
        w = w * amax
    width = 640  # five 128-key tiles
    want = indexer_logits(q, cache, w, k_format="fp8", block_table=table, context_lens=ctx, next_n=n, max_len=width)
    ref = naive.indexer_logits_ref(q.float(), cache, w, k_format="fp8", block_table=table, context_lens=ctx, next_n=n,
                                   max_len=width)
    assert torch.allclose(want, ref, rtol=1e-5, atol=1e-5)
    got = torch.full((R * n, width), 12345.0)
    indexer_logits(q, cache, w, k_format="fp8", block_table=table, context_lens=ctx, next_n=n, max_len=width,
                   out=got, row_bound_only=True)
    for t in range(R * n):
        L = int(ctx[t // n])
        assert torch.equal(got[t, :L], want[t, :L]), t
        end = 0 if L == 0 else -(-L // 128) * 128
        assert torch.isinf(got[t, L:end]).all() and (got[t, end:] == 12345.0).all(), t
        assert torch.isinf(want[t, L:]).all()


@pytest.mark.parametrize("k_format", ["bf16", "fp8"])
@pytest.mark.parametrize("tiles", [2, 3, 8])
def test_paged_tiles_per_program(monkeypatch, tiles, k_format):
    """`PAGED_TILES` programs (several consecutive tiles each, q loaded once): the launch's grid shrinks by that
    factor and the scores are those of one tile a program bit for bit, every position of every row written (-inf
    past each query's own), for chunks cut short by the row's end, queries whose position ends mid-chunk, in the
    chunk's first tile or before it (context 0), next_n 2. Rows of 5 tiles: chunks of 2 (three programs, the last
    one tile), 3 (two) and 8 (one)."""
    import glm5lib.kernels.indexer as ix

    grids = []
    real = ix._PAGED
    monkeypatch.setattr(ix, "_PAGED", lambda grid, *a, **kw: grids.append((grid, a[-1])) or real(grid, *a, **kw))
    g = torch.Generator().manual_seed(7)
    bs, nb, HI, n = 16, 80, 4, 2
    keys = torch.randn(nb * bs, 128, generator=g)
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(keys), bs) if k_format == "fp8" else \
        keys.to(DTYPE).view(nb, bs, 128)
    table = torch.randperm(nb, generator=g)[:76].view(4, 19).to(torch.int32)
    ctx = torch.tensor([140, 0, 300, 129], dtype=torch.int32)  # ends in tile 1, none, tile 2, the first key of tile 1
    q = torch.randn(4 * n, HI, 128, generator=g).to(DTYPE)
    w = torch.randn(4 * n, HI, generator=g)
    width = 600  # five 128-key tiles, the last one cut at 88
    kw = dict(k_format=k_format, block_table=table, context_lens=ctx, next_n=n, max_len=width)
    one = indexer_logits(q, cache, w, **kw)
    monkeypatch.setattr(ix, "PAGED_TILES", tiles)
    got = indexer_logits(q, cache, w, **kw, out=torch.full((4 * n, width), 12345.0))
    assert [gr for gr, _ in grids] == [(4 * n, 5), (4 * n, -(-5 // tiles))] and grids[-1][1] == tiles
    assert torch.equal(got, one)
    ref = naive.indexer_logits_ref(q.float(), cache, w, **kw)
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert torch.allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)
    for t in range(4 * n):
        assert torch.isinf(got[t, int(ctx[t // n]) - n + t % n + 1:]).all(), t


@pytest.mark.parametrize("forced", [None, False, True])
def test_paged_dot_layout_follows_q_dtype(monkeypatch, forced):
    """The paged launch takes `paged_keys_m(q.dtype)` (keys as M for fp8 q, heads as M otherwise) unless
    PAGED_KEYS_M forces a layout, and both layouts score alike for both q dtypes."""
    import glm5lib.kernels.indexer as ix

    monkeypatch.setattr(ix, "PAGED_KEYS_M", forced)
    launched = []
    real = ix._PAGED

    def spy(grid, *args, **kw):
        launched.append(kw["KEYS_M"])
        return real(grid, *args, **kw)

    monkeypatch.setattr(ix, "_PAGED", spy)
    g = torch.Generator().manual_seed(3)
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(torch.randn(8 * 16, 128, generator=g)), 16)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    ctx = torch.tensor([64, 37], dtype=torch.int32)
    q = torch.randn(2, 8, 128, generator=g)
    w = torch.rand(2, 8, generator=g)
    q8, amax = naive.quantize_indexer_q(q)
    for qq, ww in ((q.to(DTYPE), w), (q8, w * amax)):
        kw = dict(k_format="fp8", block_table=table, context_lens=ctx, max_len=64)
        got = indexer_logits(qq, cache, ww, **kw)
        want = naive.indexer_logits_ref(qq.float(), cache, ww, **kw)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    expect = [False, True] if forced is None else [forced, forced]
    assert launched == expect


def test_paged_q_form_rule(monkeypatch):
    """bf16 q over fp8 keys is rewritten: by the rule (PAGED_Q_FORM None) into two e4m3 terms on sm_90, where that
    was timed, and into fp16 on other GPUs and off a GPU; PAGED_Q_FORM forces a form ("e4m3x2" falls back to "f16"
    without hardware e4m3); nothing else is rewritten unless PAGED_Q_REWRITE forces it (never fp8 q or bf16 keys);
    a bad form is refused."""
    import glm5lib.kernels.indexer as ix

    assert ix.PAGED_Q_FORM is None and ix.paged_q_form(torch.bfloat16, "fp8") == "f16"
    cap = {"value": (9, 0)}
    monkeypatch.setattr(ix, "capability", lambda dev: cap["value"])
    monkeypatch.setattr(ix, "fp8_hw", lambda dev: dev.type == "cuda" and cap["value"] >= (8, 9))
    gpu = torch.device("cuda", 0)
    assert ix.paged_q_form(torch.bfloat16, "fp8", gpu) == "e4m3x2"
    assert ix.paged_q_form(torch.bfloat16, "fp8", torch.device("cpu")) == "f16"
    for other in ((8, 0), (8, 9), (10, 0), (12, 0)):  # not timed there (sm_80 has no hardware e4m3 at all)
        cap["value"] = other
        assert ix.paged_q_form(torch.bfloat16, "fp8", gpu) == "f16", other
    cap["value"] = (9, 0)
    assert ix.paged_q_form(torch.float16, "fp8", gpu) is None and ix.paged_q_form(torch.bfloat16, "bf16", gpu) is None
    monkeypatch.setattr(ix, "PAGED_Q_FORM", "f16")  # the exact form, forced
    assert ix.paged_q_form(torch.bfloat16, "fp8", gpu) == "f16"
    monkeypatch.setattr(ix, "PAGED_Q_FORM", None)
    assert ix.paged_q_form(torch.float16, "fp8") is None and ix.paged_q_form(torch.float32, "fp8") is None
    assert ix.paged_q_form(torch.bfloat16, "bf16") is None and ix.paged_q_form(torch.float8_e4m3fn, "fp8") is None
    monkeypatch.setattr(ix, "PAGED_Q_REWRITE", True)
    assert ix.paged_q_form(torch.float32, "fp8") == "f16" and ix.paged_q_form(torch.float8_e4m3fn, "fp8") is None
    assert ix.paged_q_form(torch.bfloat16, "bf16") is None
    monkeypatch.setattr(ix, "PAGED_Q_FORM", "e4m3x2")
    monkeypatch.setattr(ix, "fp8_hw", lambda dev: dev.type == "cuda")
    cap["value"] = (12, 0)
    assert ix.paged_q_form(torch.bfloat16, "fp8", torch.device("cuda")) == "e4m3x2"
    assert ix.paged_q_form(torch.bfloat16, "fp8", torch.device("cpu")) == "f16"
    monkeypatch.setattr(ix, "PAGED_Q_FORM", "fp4")
    with pytest.raises(ValueError, match="PAGED_Q_FORM"):
        ix.paged_q_form(torch.bfloat16, "fp8")
    monkeypatch.setattr(ix, "PAGED_Q_REWRITE", False)
    assert ix.paged_q_form(torch.bfloat16, "fp8") is None
    # the dot layout: keys as M for fp8 q and for rewritten or fp16 q over fp8 keys
    assert ix.paged_keys_m(torch.float8_e4m3fn) and ix.paged_keys_m(torch.float16, "fp8")
    assert ix.paged_keys_m(torch.bfloat16, "fp8", "f16-kernel") and not ix.paged_keys_m(torch.bfloat16, "fp8")
    assert not ix.paged_keys_m(torch.float16, "bf16") and not ix.paged_keys_m(torch.bfloat16)


@pytest.mark.parametrize("form", ["f16", "f16-kernel", "e4m3x2"])
@pytest.mark.parametrize("keys_m", [False, True], ids=["heads-M", "keys-M"])
def test_paged_q_rewrite_scores_like_the_reference(monkeypatch, keys_m, form):
    """Each rewrite of q (fp16 times a power of two per head, the inverse in the weight, in a launch before the
    scores or inside them; two e4m3 terms per head added before the ReLU) scores like the fp32 reference, for
    heads whose magnitudes span 2^-40..2^40 (each needs its own factor: one shared factor would overflow or flush
    the small heads to zero), a zero head and a head of bf16 subnormals. q holds bf16 values: the fp16 forms carry
    them exactly (only fp32 summation order is left: 1e-5), two e4m3 terms to about 2^-9 (2e-3 here)."""
    import glm5lib.kernels.indexer as ix

    monkeypatch.setattr(ix, "PAGED_Q_REWRITE", True)
    monkeypatch.setattr(ix, "PAGED_Q_FORM", form)
    monkeypatch.setattr(ix, "PAGED_KEYS_M", keys_m)
    launched = []
    real = ix._PAGED
    monkeypatch.setattr(ix, "_PAGED", lambda grid, *a, **kw: launched.append((kw["F16_DOT"], kw["Q_TERMS"], a[0].dtype))
                        or real(grid, *a, **kw))
    g = torch.Generator().manual_seed(5)
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(torch.randn(8 * 16, 128, generator=g)), 16)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    ctx = torch.tensor([64, 45], dtype=torch.int32)
    HI = 8
    mag = torch.tensor([1.0, 2.0 ** 40, 2.0 ** -40, 0.0, 2.0 ** -20, 3.0, 2.0 ** 17, 2.0 ** -126])
    q = (torch.randn(2, HI, 128, generator=g) * mag[None, :, None]).to(torch.bfloat16).float()
    w = torch.rand(2, HI, generator=g) / mag.clamp(min=2.0 ** -60)[None, :]  # every head weighs in alike
    kw = dict(k_format="fp8", block_table=table, context_lens=ctx, max_len=64)
    got = indexer_logits(q, cache, w, **kw)
    want = naive.indexer_logits_ref(q, cache, w, **kw)
    expect = {"f16": (False, 1, torch.float16), "f16-kernel": (True, 1, torch.float32),
              "e4m3x2": (False, 2, torch.float8_e4m3fn)}[form]
    assert launched == [expect]
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    tol = 2e-3 if form == "e4m3x2" else 1e-5
    assert torch.allclose(got[fin], want[fin], rtol=tol, atol=tol * float(want[fin].abs().max()))
    # each head scored on its own: drop one, and the scores must move (the rewrite did not zero it)
    for h in (1, 2, 4):
        w_drop = w.clone()
        w_drop[:, h] = 0
        assert not torch.allclose(indexer_logits(q, cache, w_drop, **kw)[fin], got[fin], rtol=1e-4, atol=0), h


def test_rewrite_q_e4m3x2_terms():
    """The two e4m3 terms of a head sum back to it far closer than one term does (vLLM's fp8 q), every value is
    e4m3's round-to-nearest-even of what it rounds (torch's conversion as the reference, subnormals included), each
    head's largest value sits in [2^7, 2^8] before the factor, and the factors are powers of two folded into the
    weights."""
    from glm5lib.kernels.indexer import rewrite_q

    g = torch.Generator().manual_seed(7)
    q = (torch.randn(64, 5, 128, generator=g) * torch.tensor([1e-3, 1.0, 50.0, 1e4, 0.3])[None, :, None])
    q[0, 0] = torch.linspace(-3, 3, 128) * 2.0 ** -7  # values that land among e4m3's subnormals after the factor
    q = q.to(torch.bfloat16).float()
    w = torch.rand(64, 5, generator=g)
    terms, w2 = rewrite_q(q, w, "e4m3x2")
    assert terms.shape == (2, 64, 5, 128) and terms.dtype == torch.float8_e4m3fn
    down = w2 / w
    assert torch.equal(torch.frexp(down).mantissa, torch.full_like(down, 0.5))
    y = q / down[..., None]
    t = terms.float()
    assert torch.equal(t[0], y.to(torch.float8_e4m3fn).float())
    assert torch.equal(t[1], (y - t[0]).to(torch.float8_e4m3fn).float())
    err1 = ((t[0] - y).norm(dim=-1) / y.norm(dim=-1)).max()
    err2 = ((t[0] + t[1] - y).norm(dim=-1) / y.norm(dim=-1)).max()
    assert err2 < 2e-3 and err2 < err1 / 8, (float(err1), float(err2))
    top = t[0].abs().amax(-1)
    assert ((top >= 128) & (top <= 256)).all()  # [2^7, 2^8) before rounding, which may reach 2^8


def test_paged_tiles_rule(monkeypatch):
    """Tiles a program: 8 over bf16 keys and 4 for q rewritten into two e4m3 terms on sm_90 with the tile they were
    timed with, 1 over fp8 keys otherwise (fp16 q, fp8 q, the fp16 rewrite) or fp16 keys, on other GPUs, off a GPU
    and for another tile; PAGED_TILES overrides; the compile report and the launch take that count."""
    import glm5lib.kernels.indexer as ix

    gpu = torch.device("cuda", 0)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(ix, "capability", lambda dev: cap["value"])
    assert ix.paged_tiles("bf16", gpu) == 8 and ix.paged_tiles("fp8", gpu) == 1 and ix.paged_tiles("fp16", gpu) == 1
    assert ix.paged_tiles("fp8", gpu, "e4m3x2") == 4 and ix.paged_tiles("fp8", gpu, "f16") == 1
    assert ix.paged_tiles("bf16", torch.device("cpu")) == 1
    assert ix.paged_tiles("fp8", torch.device("cpu"), "e4m3x2") == 1
    cap["value"] = (12, 0)
    assert ix.paged_tiles("bf16", gpu) == 1 and ix.paged_tiles("fp8", gpu, "e4m3x2") == 1  # not measured there
    cap["value"] = (9, 0)
    monkeypatch.setitem(ix.INDEXER_CONFIGS, "paged", (0, 64, 4, 2))
    assert ix.paged_tiles("bf16", gpu) == 1
    monkeypatch.setattr(ix, "PAGED_TILES", 3)
    assert ix.paged_tiles("fp8", torch.device("cpu")) == 3
    monkeypatch.setattr(ix, "PAGED_TILES", None)
    monkeypatch.setitem(ix.INDEXER_CONFIGS, "paged", ix.SM90_TIMED_TILE)
    from glm5lib.kernels.compile_report import indexer_paged_spec

    # the compile report builds what the rule launches: 8 tiles over bf16 keys on sm_90, uncapped; 1 over fp8 keys
    # (capped) and on the looping grid
    spec = indexer_paged_spec(90, torch.bfloat16, False, False)
    assert spec.constexprs["MULTI"] and "TILES" not in spec.constexprs and spec.maxnreg is None and "-t8-" in spec.name
    # bf16 q over fp8 keys on sm_90: the rule's two e4m3 terms, 4 tiles, uncapped; fp16 rewrite, one tile on sm_89
    spec = indexer_paged_spec(90, torch.bfloat16, True, False)
    assert spec.constexprs["Q_TERMS"] == 2 and spec.constexprs["MULTI"] and spec.maxnreg is None, spec.name
    assert "-t4-" in spec.name and spec.name.endswith(":fp8:e4m3x2]"), spec.name
    spec = indexer_paged_spec(89, torch.bfloat16, True, False)
    assert spec.constexprs["Q_TERMS"] == 1 and spec.constexprs["TILES"] == 1 and spec.name.endswith(":fp8:f16]")
    from glm5lib.kernels.compile_report import shipped_kernels

    for arch, prep in ((90, "e4m3x2"), (89, "f16"), (120, "f16"), (80, "f16")):  # and the prepass the rule launches
        assert [s.name for s in shipped_kernels(arch) if "q_prep" in s.name] == [f"indexer_q_prep[Hi32:{prep}]"], arch
    for one in (indexer_paged_spec(90, torch.float8_e4m3fn, True, False), indexer_paged_spec(90, torch.bfloat16, False, True),
                indexer_paged_spec(89, torch.bfloat16, False, False)):
        assert not one.constexprs["MULTI"] and one.constexprs["TILES"] == 1, one.name
    monkeypatch.setattr(ix, "PAGED_TILES", 4)  # as a GPU of the rule would: the launch follows it
    launched = []
    real = ix._PAGED
    monkeypatch.setattr(ix, "_PAGED", lambda grid, *a, **kw: launched.append((grid, a[-1])) or real(grid, *a, **kw))
    g = torch.Generator().manual_seed(8)
    keys = torch.randn(40 * 16, 128, generator=g).to(DTYPE).view(40, 16, 128)
    q = torch.randn(2, 4, 128, generator=g).to(DTYPE)
    w = torch.rand(2, 4, generator=g)
    kw = dict(block_table=torch.arange(40, dtype=torch.int32).view(2, 20), context_lens=torch.tensor([320, 9]),
              max_len=320)
    got = indexer_logits(q, keys, w, **kw)
    assert launched == [((2, 1), 4)]
    want = naive.indexer_logits_ref(q.float(), keys, w, **kw)
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got)) and torch.allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)
    # over fp8 keys the launch asks the rule with the form q is rewritten into (the looping grid never asks)
    monkeypatch.setattr(ix, "PAGED_TILES", None)
    monkeypatch.setattr(ix, "PAGED_Q_REWRITE", True)
    monkeypatch.setattr(ix, "PAGED_Q_FORM", "e4m3x2")
    asked = []
    monkeypatch.setattr(ix, "paged_tiles", lambda fmt, dev, form=None: asked.append((fmt, form)) or 2)
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(keys.reshape(-1, 128).float()), 16)
    launched.clear()
    got = indexer_logits(q, cache, w, k_format="fp8", **kw)
    indexer_logits(q, cache, w, k_format="fp8", row_bound_only=True, out=torch.full_like(got, float("-inf")), **kw)
    assert asked == [("fp8", "e4m3x2")] and launched[0] == ((2, 2), 2) and launched[1][1] == 1  # 3 tiles, 2 a program


def test_paged_maxnreg_rule(monkeypatch):
    """The register cap: on sm_90 only, keys as M over fp8 keys, one tile a program, 80 for one fp8 term, 96 for
    fp16; none for two e4m3 terms, the looping grid, other layouts or GPUs; PAGED_MAXNREG overrides (0: no cap);
    the launch passes it to Triton."""
    import glm5lib.kernels.indexer as ix

    gpu = torch.device("cuda", 0)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(ix, "capability", lambda dev: cap["value"])
    f8, f16 = torch.float8_e4m3fn, torch.float16
    rule = ix.paged_maxnreg
    assert rule(f8, "fp8", True, 1, False, gpu) == 80 and rule(f16, "fp8", True, 1, False, gpu) == 96
    assert rule(f8, "fp8", True, 2, False, gpu) is None and rule(f16, "fp8", False, 1, False, gpu) is None
    assert rule(f16, "fp8", True, 1, True, gpu) is None  # the looping grid: the caps spill there
    assert rule(f8, "fp8", True, 1, False, gpu, 4) is None  # several tiles a program: the same loop
    assert rule(torch.bfloat16, "fp8", True, 1, False, gpu) is None
    assert rule(f16, "bf16", True, 1, False, gpu) is None
    assert rule(f16, "fp8", True, 1, False, torch.device("cpu")) is None
    cap["value"] = (12, 0)
    assert rule(f16, "fp8", True, 1, False, gpu) is None  # not measured there
    monkeypatch.setattr(ix, "PAGED_MAXNREG", 0)
    cap["value"] = (9, 0)
    assert rule(f16, "fp8", True, 1, False, gpu) is None
    monkeypatch.setattr(ix, "PAGED_MAXNREG", 64)
    assert rule(torch.bfloat16, "bf16", False, 1, True, torch.device("cpu")) == 64
    launched = []
    real = ix._PAGED
    monkeypatch.setattr(ix, "_PAGED", lambda grid, *a, **kw: launched.append(kw.get("maxnreg")) or real(grid, *a, **kw))
    g = torch.Generator().manual_seed(4)
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(torch.randn(4 * 16, 128, generator=g)), 16)
    kw = dict(k_format="fp8", block_table=torch.arange(4, dtype=torch.int32).view(1, 4),
              context_lens=torch.tensor([50], dtype=torch.int32), max_len=64)
    q, w = torch.randn(1, 4, 128, generator=g), torch.rand(1, 4, generator=g)
    indexer_logits(q, cache, w, **kw)  # the interpreter ignores the cap
    monkeypatch.setattr(ix, "PAGED_MAXNREG", None)
    indexer_logits(q, cache, w, **kw)
    assert launched == [64, None]


def test_topk_probe_variants_run_and_agree(monkeypatch):
    """Every variant `scripts/topk_dist_probe.py` times (its default, `--sweep`, `--sparse`, `--configs` and
    `--rule` lists) is a call `topk_select` accepts, and gives the stable sort's picks on small rows (on the CPU,
    through the interpreter): a variant naming a removed option fails here, not on the GPU."""
    import importlib.util
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # the probe imports bench_topk_long beside it
    spec = importlib.util.spec_from_file_location("topk_dist_probe", scripts / "topk_dist_probe.py")
    probe = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "topk_dist_probe", probe)
    spec.loader.exec_module(probe)
    x = torch.randn(2, 3000, generator=torch.Generator().manual_seed(9))
    lengths = torch.tensor([3000, 2500], dtype=torch.int32)
    want = _stable_picks(x, 64, lengths)
    variants = probe.VARIANTS + probe.SWEEP_VARIANTS + probe.SPARSE_VARIANTS + probe.CONFIG_VARIANTS
    for name, kw in variants + probe.RULE_VARIANTS:
        kw = dict(kw)
        if "config" in kw:  # the probe's 16-warp config: the same picks at a small block
            kw["config"] = (512, 4, 8)
        if "chunk" in kw:
            kw["chunk"] = 1024
        got = probe.select(x, 64, lengths=lengths, **kw)
        assert [r.tolist() for r in got] == want, name


def test_ncu_sass_top_sums_stalls_per_loop(tmp_path, capsys):
    """`scripts/ncu_sass_top.py` on a source-page CSV: the top instructions, per opcode, and per loop (a backward
    branch's range; its target an address or an offset from the function's start) the stall samples and executed
    warp instructions; a file without stall samples is refused in one line."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "ncu_sass_top.py"
    spec = importlib.util.spec_from_file_location("ncu_sass_top", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    csv = tmp_path / "sass.csv"
    csv.write_text('"Kernel Name","k"\n"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n'
                   '"0x7f0000000000","MOV R1, c[0x0][0x28]","1","10"\n'
                   '"0x7f0000000010","LOP3.LUT R2, R3, R4, RZ, 0xc0, !PT","5","100"\n'
                   '"0x7f0000000020","@P0 BRA 0x7f0000000010","2","100"\n'
                   '"0x7f0000000030","IADD3 R2, R3, R4, RZ","3","50"\n'
                   '"0x7f0000000040","@P1 BRA 0x30","1","50"\n"0x7f0000000050","EXIT","0","1"\n')
    assert mod.main([str(csv), "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(" 41.7 %") and "LOP3" in out[1]
    assert out[-2] == "loop 0x7f0000000010-0x7f0000000020: 2 instructions, 58.3 % of stall samples, 200 warp " \
                      "instructions executed"
    assert out[-1].startswith("loop 0x7f0000000030-0x7f0000000040: 2 instructions, 33.3 %")
    bad = tmp_path / "bad.csv"
    bad.write_text("nothing here\n")
    with pytest.raises(SystemExit, match="not a source-page CSV"):
        mod.main([str(bad)])
