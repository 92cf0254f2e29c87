"""`glm5lib.bench.gather`: the gather-ceiling probes sum exactly the words of the rows they are given (the
Triton probe in the CPU interpreter against torch's sums), the index patterns hold the same rows, and the TMA
probe builds for sm_90 and sm_120 within shared memory (Gluon does not run in the interpreter; its sums are checked
on the GPU by `main` before anything is timed)."""

from __future__ import annotations

import pytest
import torch
from compiled import compile_rows

from glm5lib.bench import gather
from glm5lib.kernels import naive


def _cache(fmt: str, n_rows: int = 150, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(n_rows, naive.D_QK, generator=g)
    cache = naive.quantize_fp8_ds_mla(kv) if fmt == "fp8_ds_mla" else kv.to(torch.bfloat16)
    return cache.view(n_rows // 50, 50, -1)  # a paged cache of 50-row blocks


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("cfg", [(16, 4, 32), (8, 2, 40)])
def test_triton_probe_sums_the_gathered_words(fmt, cfg):
    cache = _cache(fmt)
    words = gather.row_words(cache)
    assert words.shape == (150, 164 if fmt == "fp8_ds_mla" else 288)
    g = torch.Generator().manual_seed(1)
    idx = torch.stack([torch.randperm(150, generator=g)[:70] for _ in range(3)]).to(torch.int32)
    want = gather.torch_sums(words, idx)
    got = gather.per_token(gather.run_triton(words, idx, cfg), 3)
    assert torch.equal(got, want)  # 70 keys over 32- or 40-key programs: tails and several tiles each
    other = gather.per_token(gather.run_triton(words, (idx + 1) % 150, cfg), 3)
    assert not torch.equal(other, want)  # the sums depend on which rows were read


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("vecs", [256, 512])
def test_flat_probe_sums_the_gathered_words(fmt, vecs):
    cache = _cache(fmt)
    words = gather.row_words(cache)
    rows = vecs // (words.shape[1] // 4)  # 6 / 12 rows of 656 bytes, 3 / 7 of 1152
    g = torch.Generator().manual_seed(2)
    idx = torch.stack([torch.randperm(150, generator=g)[:70] for _ in range(3)]).to(torch.int32)
    want = gather.torch_sums(words, idx)
    assert torch.equal(gather.per_token(gather.run_flat(words, idx, (vecs, 4, 4 * rows)), 3), want)
    assert not torch.equal(gather.per_token(gather.run_flat(words, (idx + 3) % 150, (vecs, 4, 4 * rows)), 3), want)
    with pytest.raises(ValueError, match="flat probe"):
        gather.run_flat(words, idx, (vecs, 4, 4 * rows + 1))  # a program must hold whole tiles


def test_patterns_hold_the_random_rows_in_order_or_a_run():
    base = torch.tensor([0, 1000, 2000], dtype=torch.int32)
    idx = torch.stack([torch.randperm(1000)[:64] for _ in range(3)]).to(torch.int32) + base[:, None]
    p = gather.make_patterns(idx, base, 1000, shift=100)
    assert torch.equal(p["sorted"], idx.sort(1).values)
    assert torch.equal(p["sorted"].sort(1).values, idx.sort(1).values) and not torch.equal(p["sorted"], idx)
    assert torch.equal(p["contiguous"][1], torch.arange(1100, 1164, dtype=torch.int32))
    wrapped = gather.make_patterns(idx, base, 1000, shift=2000)["contiguous"]  # the run stays inside the context
    assert int(wrapped.max()) < 3000 and int((wrapped - base[:, None]).min()) >= 0


def test_summary_takes_each_methods_best():
    rows = [{"method": "triton", "pattern": "random", "B": 128, "kv_format": "bf16", "config": c, "us": u,
             "GBps": g, "pct_copy": g / 10} for c, u, g in (("a", 2.0, 500.0), ("b", 1.0, 700.0))]
    rows.append({"method": "tma", "pattern": "random", "B": 128, "kv_format": "bf16", "config": "x", "error": "E"})
    (s,) = gather.summary(rows)
    assert s["triton"]["config"] == "b" and s["triton"]["pct_copy"] == 70.0
    assert s["tma"] is None and s["torch"] is None and s["stream"] is None


def test_gather_refuses_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gather.main(["--json", str(tmp_path / "g.json")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "g.json").exists()
    from glm5lib.bench.cli import main as bench_main

    assert bench_main(["bench", "gather", "--out", str(tmp_path)]) == 2  # the same through `glm5lib bench gather`
    assert "CUDA GPU" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_gather_keeps_what_the_user_has(tmp_path, capsys):
    """An existing result (or its PNG) is refused before anything is measured, unless --force; a missing
    directory is named."""
    old = tmp_path / "g.json"
    old.write_text("mine")
    assert gather.main(["--json", str(old)]) == 2
    assert "already exists" in capsys.readouterr().err and old.read_text() == "mine"
    (tmp_path / "h.png").write_bytes(b"png")
    assert gather.main(["--json", str(tmp_path / "h.json")]) == 2
    assert "h.png: already exists" in capsys.readouterr().err and not (tmp_path / "h.json").exists()
    assert gather.main(["--json", str(tmp_path / "nope" / "g.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


_SCRIPT = """
import json
from glm5lib.bench import gather as g
from glm5lib.kernels.mla_gluon import cubin_usage
for arch in (90, 120):
    for wide, cfgs in g.TMA_CONFIGS.items():
        for cfg in cfgs:
            try:
                k = g.aot_compile_tma(cfg, wide, arch)
                r = {"shared": int(k.metadata.shared), "tma": k.asm["ptx"].count("cp.async.bulk.tensor"),
                     **cubin_usage(k.asm["cubin"])}
            except Exception as exc:
                r = {"error": str(exc)[-400:]}
            print(json.dumps({"arch": arch, "wide": wide, "cfg": cfg, **r}), flush=True)
"""


@pytest.mark.skipif(not gather.HAVE_TMA, reason="this Triton has no Gluon TMA")
def test_tma_probe_builds_with_one_copy_per_row():
    rows = compile_rows(_SCRIPT)
    assert len(rows) == 2 * sum(len(c) for c in gather.TMA_CONFIGS.values())
    bad = [r for r in rows if "error" in r]
    assert not bad, bad
    for r in rows:
        rows_, stages, _, _ = r["cfg"]
        ring = stages * rows_ * gather.TMA_BOX * (8 if r["wide"] else 4)
        assert ring <= r["shared"] <= ring + 1024  # the ring and its mbarriers
        assert r["shared"] <= 227 * 1024
        # one TMA copy per row of a tile, in the prologue (STAGES tiles) and the loop (unrolled STAGES times)
        assert r["tma"] == 2 * stages * rows_
        assert not r["local"]


def test_plot_draws_each_method_per_format_and_batch(tmp_path):
    rows = [{"method": m, "pattern": "contiguous" if m == "stream" else "random", "B": B, "kv_format": f,
             "config": "c", "us": 1.0, "GBps": 1.0, "pct_copy": p}
            for f in ("fp8_ds_mla", "bf16") for B in (32, 128)
            for m, p in zip(gather.METHODS, (90.0, 50.0, 70.0, 75.0, 45.0))]
    png = gather.plot({"gpu": "NVIDIA H200", "commit": "abc1234", "rows": rows}, tmp_path / "g.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


_L2_SCRIPT = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from glm5lib.bench import gather as g
fn = g._flat_gather_kernel
for name, hint in (("flat", False), ("flat-l2", True)):
    consts = {"VPR": 41, "V": 1024, "ROWS": 24, "L2_HINT": hint}
    sig = {a: ("constexpr" if a in consts else {"SRC": "*i32", "IDX": "*i32", "OUT": "*i32"}.get(a, "i32"))
           for a in fn.arg_names}
    c = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("SRC", "IDX", "OUT")}
    ptx = triton.compile(ASTSource(fn, sig, c, attrs), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4}).asm["ptx"]
    print(json.dumps({"name": name, "v4": ptx.count("ld.global.v4") + ptx.count("ld.global.L2::256B.v4"),
                      "hint": ptx.count("L2::256B")}))
"""


def test_l2_hint_probe_loads_what_the_flat_probe_loads_with_the_hint():
    """The `flat-l2` route differs from `flat` only by the hint: as many 16-byte loads, each with L2::256B (its
    sums are checked on the GPU; inline PTX does not run in the interpreter)."""
    rows = {r["name"]: r for r in compile_rows(_L2_SCRIPT, timeout=600)}
    assert len(rows) == 2
    flat, l2 = rows["flat"], rows["flat-l2"]
    assert flat["hint"] == 0 and l2["hint"] == l2["v4"] == flat["v4"] > 0


def test_route_rows_take_the_fastest_checked_route_and_report_a_wrong_one(monkeypatch):
    """`glm5lib bench`'s ceiling rows (interpreter): each route's sums are checked, the fastest checked route is
    the ceiling, and a route whose sums are wrong (or that raises) becomes an error row instead of a time."""
    from glm5lib.bench import kernels as bench

    cache = _cache("fp8_ds_mla", n_rows=300)
    words = gather.row_words(cache)
    g = torch.Generator().manual_seed(3)
    ids = [torch.stack([torch.randperm(300, generator=g)[:48] for _ in range(2)]).to(torch.int32)]
    ceil = {"copy_GBps": 4000.0, "matmul_bf16_TFLOPs": 700.0}
    times = iter([3.0, 1.0, 2.0, 4.0])  # ms per route, in BENCH_ROUTES order
    rows = gather._route_rows("decode", 2, "fp8_ds_mla", words, ids, ceil, lambda fns: (fns[0](), next(times))[1])
    (best,) = rows
    assert best["impl"] == "best-gather" and best["ms"] == 1.0 and best["case"] == "decode"
    assert best["route"] == "{} {}".format(*gather.BENCH_ROUTES["fp8_ds_mla"][1])
    assert best["pct_bw"] == pytest.approx(100 * 2 * 48 * 656 / 1e-3 / 1e9 / 4000.0)
    real = gather.run_flat
    monkeypatch.setattr(gather, "run_flat", lambda w, i, c, o=None: real(w, (i + 1) % 300, c, o))
    times = iter([5.0, 6.0])
    rows = gather._route_rows("decode", 2, "fp8_ds_mla", words, ids, ceil, lambda fns: next(times))
    errors = [r for r in rows if "error" in r]
    assert len(errors) == 2 and all("differ from torch" in r["error"] for r in errors)  # both flat routes
    assert [r["ms"] for r in rows if "error" not in r] == [5.0]
