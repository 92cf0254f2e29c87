"""CUDA-graph readiness of GLM5_SPARSE_MLA and the glm5lib indexer, checked on CPU (Triton's interpreter):
uniform-decode detection, the builders' persistent step buffers (refilled in place, same addresses), the static
decode top-k against the per-request path (padding requests inert, stale workspace ignored), the indexer custom
op and its place among vLLM's splitting ops, the patch registry, and the GPU harness's `--graphs` mode run
eagerly on tiny shapes (capture itself needs CUDA; the H200 run is the integrator's)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

import glm5lib.kernels.common  # noqa: F401  (before Triton: the interpreter switch)

pytest.importorskip("vllm")

import glm5lib.vllm_plugin as plugin  # noqa: E402
from glm5lib.vllm_plugin.paged import (StepBuffers, decode_topk, req_id_per_token, step_topk,  # noqa: E402
                                       uniform_decode_len, write_indexer_keys)


@pytest.fixture(scope="module", autouse=True)
def registered():
    torch.set_num_threads(1)
    plugin.register()
    yield


@pytest.mark.parametrize("lens, tokens, want", [
    ([1, 1, 1], 3, 1),
    ([1, 1, 0, 0], 4, 1),  # vLLM's padding requests: no query tokens, tokens padded to requests x n
    ([2, 2, 2], 6, 2),  # MTP next_n = 2
    ([2, 2, 0], 6, 2),
    ([1, 1, 5], 7, 0),  # a prefill chunk behind the decodes
    ([2, 1], 3, 0),
    ([1, 1], 3, 0),  # tokens not requests x n
    ([0, 1], 2, 0),  # padding first is not vLLM's layout
    ([9, 9], 18, 0),  # longer than the batched launch takes
])
def test_uniform_decode_len(lens, tokens, want):
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    assert uniform_decode_len(qsl, len(lens), tokens) == want


def test_step_buffers_refill_in_place():
    buf = StepBuffers(32, "cpu")
    g = torch.Generator().manual_seed(0)
    ptr_r, ptr_l = buf.req_id_per_token.data_ptr(), buf.token_lens.data_ptr()
    for _ in range(4):
        lens = torch.randint(0, 4, (6,), generator=g)
        lens[0] = max(1, int(lens[0]))
        qsl = torch.tensor([0, *lens.cumsum(0).tolist()], dtype=torch.int32)
        T = int(qsl[-1]) + 3  # padded tokens after the last request
        got = buf.fill_req_ids(qsl, 6, T)
        assert got.data_ptr() == ptr_r
        assert got.tolist() == req_id_per_token(qsl, T).tolist()
        seq = torch.randint(0, 100, (6,), generator=g, dtype=torch.int32)
        lens2 = buf.fill_token_lens(seq, 6, 2)
        assert lens2.data_ptr() == ptr_l and lens2.tolist() == seq.repeat_interleave(2).tolist()
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        buf.fill_req_ids(torch.tensor([0, 40], dtype=torch.int32), 1, 40)


def _paged_keys(n_blocks, bs, seq_lens, g):
    """A paged fp8 indexer cache holding random keys at every slot, and a scrambled block table."""
    cache = torch.zeros(n_blocks, bs, 132, dtype=torch.uint8)
    write_indexer_keys(cache, torch.randn(n_blocks * bs, 128, generator=g), torch.arange(n_blocks * bs))
    per = max(math.ceil(max(seq_lens) / bs), 1)
    perm = torch.randperm(n_blocks - 1, generator=g)[: len(seq_lens) * per] + 1
    return cache, perm.view(len(seq_lens), per).to(torch.int32)


@pytest.mark.parametrize("next_n", [1, 2])
def test_decode_topk_static_equals_per_request_path(next_n):
    g = torch.Generator().manual_seed(next_n)
    bs, topk, HI = 16, 12, 4
    seq = [40, 7, 29, 0, 0]  # two padding requests (context 0) after three real ones
    real = 3
    cache, table = _paged_keys(20, bs, seq, g)
    R, T = len(seq), len(seq) * next_n
    q = torch.randn(T, HI, 128, generator=g)
    w = torch.randn(T, HI, generator=g) * 0.1
    seq_d = torch.tensor(seq, dtype=torch.int32)
    buf = StepBuffers(T, "cpu")
    lens = buf.fill_token_lens(seq_d, R, next_n)
    width = 64  # max_model_len: wider than any context
    ws = torch.full((T, width), float("nan"))  # stale workspace contents must not leak into the picks
    out = torch.full((T + 2, topk), 7, dtype=torch.int32)
    decode_topk(q, w, cache, table, seq_d, lens, next_n, topk, out, ws)
    ref = torch.full((real * next_n, topk), -1, dtype=torch.int32)
    qsl = [i * next_n for i in range(real + 1)]
    step_topk(q[: real * next_n], w[: real * next_n], cache, table[:real], qsl, seq[:real], topk, ref,
              kernel="triton", batch_decodes=False)
    got = out[: real * next_n]
    assert torch.equal(torch.sort(got, 1).values, torch.sort(ref, 1).values)
    assert (got[1 * next_n : 2 * next_n] >= 0).sum() == min(topk, 7) * next_n - (next_n - 1) * (next_n > 1)
    assert (out[real * next_n : T] == -1).all()  # padding requests pick nothing
    assert (out[T:] == 7).all()  # rows past the step untouched


def test_indexer_builder_uniform_decode_capture_and_no_host_copy():
    from glm5lib.vllm_plugin.indexer import Glm5IndexerMetadataBuilder

    b = Glm5IndexerMetadataBuilder.__new__(Glm5IndexerMetadataBuilder)
    b.buffers, b.max_model_len, b.max_decode_tokens = StepBuffers(16, "cpu"), 256, 8

    class DeviceOnly(torch.Tensor):  # a device tensor the builder must not copy to the host (it would sync)
        def cpu(self, *a, **k):
            raise AssertionError("seq_lens copied to the host")

    def common(lens, seq, tokens):
        qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        return SimpleNamespace(num_reqs=len(lens), num_actual_tokens=tokens, query_start_loc=qsl, query_start_loc_cpu=qsl,
                               seq_lens=torch.tensor(seq, dtype=torch.int32).as_subclass(DeviceOnly),
                               seq_lens_cpu_upper_bound=torch.tensor(seq, dtype=torch.int32),
                               slot_mapping=torch.arange(tokens), block_table_tensor=torch.zeros(len(lens), 4, dtype=torch.int32))

    md = b.build(0, common([1, 1, 0, 0], [30, 12, 0, 0], 4))
    assert md.decode_next_n == 1 and md.token_lens.tolist() == [30, 12, 0, 0]
    ptr = md.token_lens.data_ptr()
    md = b.build_for_cudagraph_capture(common([1, 1, 1, 1], [0, 0, 0, 0], 4))  # zeroed capture metadata
    assert md.decode_next_n == 1 and md.token_lens.tolist() == [0, 0, 0, 0] and md.token_lens.data_ptr() == ptr
    md = b.build(0, common([1, 1, 5], [30, 12, 9], 7))  # mixed: the per-request path
    assert md.decode_next_n == 0 and md.token_lens is None and md.seq_lens_cpu.tolist() == [30, 12, 9]
    md = b.build(0, common([1] * 12, [5] * 12, 12))  # more decode tokens than the score workspace holds
    assert md.decode_next_n == 0
    assert Glm5IndexerMetadataBuilder.get_cudagraph_support(None, None).name == "UNIFORM_BATCH"


def test_indexer_op_runs_the_instance_through_torch_ops(monkeypatch):
    """`Glm5SparseAttnIndexer.forward_native` goes through `torch.ops.glm5lib.sparse_attn_indexer` (opaque to
    torch.compile) and lands in the op's body: keys written, top-k as the per-request reference picks."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    from glm5lib.vllm_plugin import indexer as ix

    g = torch.Generator().manual_seed(5)
    bs, topk, HI = 16, 8, 4
    seq = [20, 33]
    cache, table = _paged_keys(12, bs, seq, g)
    before = cache.clone()
    buf = torch.full((4, topk), -1, dtype=torch.int32)
    with set_current_vllm_config(VllmConfig()):
        kc = SimpleNamespace(prefix="model.layers.0.self_attn.indexer.k_cache", kv_cache=cache)
        op = SparseAttnIndexer(kc, 128, "ue8m0", topk, 128, 64, 64, buf)
    assert type(op) is ix.Glm5SparseAttnIndexer
    slots = torch.tensor([int(table[0, 19 // bs]) * bs + 19 % bs, int(table[1, 32 // bs]) * bs + 32 % bs])
    md = ix.Glm5IndexerMetadata(num_actual_tokens=2, query_start_loc_cpu=torch.tensor([0, 1, 2]),
                                seq_lens_cpu=torch.tensor(seq), seq_lens=torch.tensor(seq, dtype=torch.int32),
                                slot_mapping=slots, block_table=table)
    monkeypatch.setattr(ix, "get_forward_context", lambda: SimpleNamespace(attn_metadata={kc.prefix: md}))
    calls = []
    real_op = torch.ops.glm5lib.sparse_attn_indexer
    monkeypatch.setattr(torch.ops.glm5lib, "sparse_attn_indexer", lambda *a: calls.append(a[1]) or real_op(*a),
                        raising=False)
    q, w, k = torch.randn(2, HI, 128, generator=g), torch.randn(2, HI, generator=g), torch.randn(2, 128, generator=g)
    got = op.forward_native(torch.zeros(2, 8), q, k, w)
    assert calls == [kc.prefix] and got is buf
    assert not torch.equal(cache, before)  # the step's keys went in
    ref = torch.full((2, topk), -1, dtype=torch.int32)
    keys = op.keys_fp32  # CPU default: exact fp32 side cache, scores from it
    step_topk(q, w, cache, table, [0, 1, 2], seq, topk, ref, keys_fp32=keys)
    assert torch.equal(buf[:2], ref)


def test_indexer_op_is_a_splitting_op():
    from vllm.config.compilation import CompilationConfig, CompilationMode

    from glm5lib.vllm_plugin.indexer import SPLITTING_OP

    assert hasattr(torch.ops.glm5lib, "sparse_attn_indexer")
    cc = CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
    cc.set_splitting_ops_for_v1("naive")
    assert SPLITTING_OP in cc.splitting_ops and "vllm::sparse_attn_indexer" in cc.splitting_ops


def test_splitting_op_is_a_registry_entry():
    """The splitting-op change is in the patch registry (its target pinned by tests/test_vllm_patches.py) and
    applied by register(): applying again changes nothing."""
    from glm5lib.vllm_plugin import indexer, patches

    entry = patches.find(patches.SPLITTING_OPS)
    assert entry.apply == "glm5lib.vllm_plugin.indexer:add_splitting_op" and entry.when == "indexer"
    assert indexer.add_splitting_op() is False
    assert patches.apply_all() == []


def test_graph_harness_cpu_mode(tmp_path):
    """`python -m glm5lib.serving.harness --graphs` on CPU: the captured step's function run eagerly on buffers
    refilled in place for two steps, equal to a second eager run, to the per-request top-k and to the fp32
    attention reference; padding and the zeroed capture metadata pick nothing and attend to nothing."""
    from glm5lib.serving.harness import main

    out = tmp_path / "graphs.json"
    assert main(["--graphs", "--device", "cpu", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["mode"] == "graphs" and rep["summary"]["replay_equals_eager"]
    assert rep["summary"]["graph_cases_ok"] == rep["summary"]["graph_cases"] == 2
    for r in rep["results"]:
        assert r["capture_metadata_inert"] and r["step0_padding_inert"] and r["step1_padding_inert"]
        assert r["step0_real"] > r["step1_real"] or r["batch"] == 1  # the second step has fewer real requests
        assert r["step0_max_abs_err_vs_reference"] < 1e-3 and r["step1_same_picks_as_per_request"]
    assert not (tmp_path / "graphs.png").exists()  # nothing timed on CPU: no figure


def test_graph_step_notices_a_stale_buffer():
    """The harness's check is not a tautology: a builder buffer left stale (token lengths from the previous
    step) makes the step disagree with the per-request reference."""
    from glm5lib.serving.graphs import DecodeStep, check_steps, graph_cases

    case = graph_cases(tiny=True)[0]
    st = DecodeStep(case, torch.device("cpu"))
    st.build = lambda: None  # the builders forget to refill their buffers
    st.capture_metadata()
    res = check_steps(st, None)
    assert not res["ok"]


def test_graph_report_summary_share_and_figure(tmp_path):
    """What notebook 05 reads from an H200 `--graphs` JSON: the summary's ratios, the projected share of a GLM-5
    decode step (78 layers next to the weight-streaming time) and the figure, on a report shaped like the GPU's."""
    from glm5lib.plotting import save_figure
    from glm5lib.serving import graphs as G

    def case(h, b, graph, kernel, eager):
        return {"case": f"graph-H{h}-bf16-B{b}", "heads": h, "kv_format": "bf16", "batch": b, "ok": True,
                "step0_equal": True, "step1_equal": True, "graph_us": graph, "kernel_us": kernel,
                "graph_over_kernel": graph / kernel, "eager_us": eager, "eager_host_us": eager * 0.9}

    rep = {"device": "fake", "results": [case(8, 1, 50.0, 48.0, 200.0), case(16, 128, 120.0, 100.0, 300.0)]}
    s = G.summarize(rep["results"])
    assert s["replay_equals_eager"] and s["timed"] == 2 and s["graph_within_1p1_of_kernel"] == 1
    assert s["graph_over_kernel_max"] == pytest.approx(1.2) and s["eager_over_graph"] == [2.5, 4.0]
    share = G.projected_attention_share(rep)
    assert [r["tp"] for r in share] == [8, 4]  # 64 heads over 8 / 16 heads per GPU
    assert share[0]["eager_ms"] == pytest.approx(78 * 0.2) and share[0]["graph_ms"] == pytest.approx(78 * 0.05)
    assert all(0 < r["graph_share"] < r["eager_share"] < 1 for r in share)
    assert G.weight_stream_ms(128) > G.weight_stream_ms(1) > G.weight_stream_ms(1, tp=16)
    assert "x1.04" in G.format_line(rep["results"][0])
    assert save_figure(G.plot(rep), tmp_path / "g.png").stat().st_size > 1000
