"""Programmatic dependent launch of the split merges (`common.pdl`): where it is on, that every split launch's plan
pairs the kernel's trigger with a merge that waits and is launched with the option, that a merge never gets the
option without its wait, and that the builds carry the instructions only where they compile (sm_90+). The GPU
timings and the bit-equality of both settings' outputs are `scripts/pdl_probe.py`'s."""

import pytest
import torch
from compiled import compile_rows

from glm5lib.kernels import common, mla


@pytest.fixture
def compiled(monkeypatch):
    """As on a GPU: not interpreted, capability by device index (0: an H200, 1: an L40S, 2: an RTX PRO 6000)."""
    monkeypatch.setattr(common, "INTERPRETED", False)
    monkeypatch.setattr(common, "PDL", True)
    caps = {0: (9, 0), 1: (8, 9), 2: (12, 0), 3: (8, 0)}
    monkeypatch.setattr(common, "capability", lambda device: caps[device.index])
    monkeypatch.setattr(common, "_triton_has_pdl", lambda: True)


@pytest.mark.parametrize("index,want", [(0, True), (1, False), (2, True), (3, False)])
def test_pdl_only_from_sm90(compiled, index, want):
    assert common.pdl(torch.device("cuda", index)) is want


def test_pdl_off_by_flag_interpreter_cpu_or_old_triton(compiled, monkeypatch):
    h200 = torch.device("cuda", 0)
    assert common.pdl(h200)
    assert not common.pdl(torch.device("cpu"))
    monkeypatch.setattr(common, "PDL", False)
    assert not common.pdl(h200)
    monkeypatch.setattr(common, "PDL", True)
    monkeypatch.setattr(common, "_triton_has_pdl", lambda: False)
    assert not common.pdl(h200)
    monkeypatch.setattr(common, "_triton_has_pdl", lambda: True)
    monkeypatch.setattr(common, "INTERPRETED", True)
    assert not common.pdl(h200)


@pytest.mark.parametrize("env,want", [(None, False), ("0", False), ("off", False), ("1", True), ("on", True),
                                      ("TRUE", True), ("yes-please", False)])
def test_pdl_is_opt_in(env, want):
    """Off unless GLM5LIB_PDL asks for it (the H100 run of round 25: at most 1.1 us to gain a merge launch, and the
    fp8-cache kernel slower with it)."""
    assert common._pdl_default(env) is want


def test_this_triton_takes_the_option():
    assert common._triton_has_pdl()  # the pinned Triton's launcher has `launch_pdl` (3.6 on the device has too)


def test_pdl_kw_pairs_the_wait_with_the_option():
    assert common.pdl_kw(True) == {"PDL": True, "launch_pdl": True}
    assert common.pdl_kw(False) == {"PDL": False}


@pytest.fixture
def pdl_on(monkeypatch):
    """`common.pdl` on for every device, and no cached plans before or after."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm, mla_gluon_large as gl_large

    monkeypatch.setattr(common, "pdl", lambda device: True)
    monkeypatch.setattr(common, "_MERGE_PDL_KW", {})
    for clear in (mla._launch_plan.cache_clear, fm.clear_plans, gl_large.clear_plans):
        clear()
    yield
    for clear in (mla._launch_plan.cache_clear, fm.clear_plans, gl_large.clear_plans):
        clear()


def test_triton_plan_pairs_trigger_and_wait(pdl_on):
    # 8 heads B4 splits the top-k list (one wave), 8 heads B4096 does not
    split = mla._launch_plan(4, 8, 2048, "bf16", "cpu", None, None, None, True, False, False)
    assert split.grid[2] > 1
    assert split.kw["PDL"] and split.merge_kw["PDL"] and split.merge_kw["launch_pdl"]
    whole = mla._launch_plan(4, 8, 2048, "bf16", "cpu", None, None, 1, True, False, False)
    assert whole.grid[2] == 1 and not whole.kw["PDL"] and "launch_pdl" not in whole.merge_kw


def test_triton_plan_without_pdl(monkeypatch):
    monkeypatch.setattr(common, "pdl", lambda device: False)
    mla._launch_plan.cache_clear()
    try:
        split = mla._launch_plan(4, 8, 2048, "bf16", "cpu", None, None, None, True, False, False)
        assert split.grid[2] > 1 and not split.kw["PDL"] and not split.merge_kw["PDL"]
        assert "launch_pdl" not in split.merge_kw
    finally:
        mla._launch_plan.cache_clear()


def test_gluon_plans_trigger_only_where_a_merge_follows(pdl_on):
    from glm5lib.kernels import mla_gluon_fp8mma as fm, mla_gluon_large as gl_large

    d = fm.DEFAULT
    args = (2048, "cpu", None, d.nbuf, d.q_terms, d.p_terms, d.maxnreg, d.block_n, d.row_threads, d.refill, d.sched)
    splits, _, _, kw, _ = fm._launch_plan(32, 8, *args, None)  # decode B32: split
    assert splits > 1 and kw["PDL"]
    splits, _, _, kw, _ = fm._launch_plan(32, 8, *args, 1)  # one split, 32 tokens: no merge
    assert splits == 1 and not kw["BALANCED"] and not kw["PDL"]
    splits, _, _, kw, _ = fm._launch_plan(600, 8, *args, None, 2048)  # prefill past a wave: balanced, cut tokens
    assert kw["BALANCED"] and kw["PDL"]
    splits, _, _, kw, _ = gl_large._ws_plan(8, 64, 2048, "cpu", None, None, "dq", 64, 0, None)
    assert splits > 1 and kw["PDL"]
    splits, _, _, kw, _ = gl_large._ws_plan(132, 64, 2048, "cpu", None, 1, "dq", 64, 0, None)
    assert splits == 1 and not kw["PDL"]
    splits, _, _, kw, _ = gl_large._ws_plan(68, 64, 2048, "cpu", None, None, "dq", 64, 0, None, 132)
    assert kw["BAL"] and kw["PDL"]
    splits, _, _, kw, _ = gl_large._ws_plan(8, 64, 2048, "cpu", None, None, "pingpong", 64, 0, None)
    assert splits > 1 and kw["PDL"]


class _Recorder:
    def __init__(self, log):
        self.log = log

    def launch(self, grid, args, kw, *rest):
        self.log.append(kw)


@pytest.mark.parametrize("on", [True, False])
def test_merges_launch_with_their_wait(monkeypatch, on):
    """Each merge's launch keywords: the wait constexpr and the option together, or neither."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm, mla_gluon_large as gl_large

    monkeypatch.setattr(common, "pdl", lambda device: on)
    monkeypatch.setattr(common, "_MERGE_PDL_KW", {})
    log = []
    for mod, name in ((mla, "_MERGE"), (fm, "_MERGE_PIECES"), (gl_large, "_MERGE_RUNS")):
        monkeypatch.setattr(mod, name, _Recorder(log))
    T, H = 4, 8
    out = torch.empty(T, H, 512)
    lse = torch.empty(T, H)
    part = torch.empty(2 * 8 * H * 513)
    mla.merge_splits(part, out, lse, 2)
    fm.merge_pieces(part, out, lse, 32, 3)
    gl_large.merge_runs(part, out, lse, 32, 8)
    assert len(log) == 3
    for kw in log:
        assert kw["PDL"] is on and kw.get("launch_pdl", False) is on


def test_set_pdl_drops_cached_plans(monkeypatch):
    from glm5lib.kernels import mla_gluon_fp8mma as fm, mla_gluon_large as gl_large

    monkeypatch.setattr(common, "PDL", common.PDL)  # restored after the test
    monkeypatch.setattr(common, "_MERGE_PDL_KW", {("cuda", 0): {"PDL": True, "launch_pdl": True}})
    mla._launch_plan(4, 8, 2048, "bf16", "cpu", None, None, None, True, False, False)
    gl_large._ws_plan(8, 64, 2048, "cpu", None, None, "dq", 64, 0, None)
    d = fm.DEFAULT
    fm._launch_plan(32, 8, 2048, "cpu", None, d.nbuf, d.q_terms, d.p_terms, d.maxnreg, d.block_n, d.row_threads,
                    d.refill, d.sched, None)
    assert min(f.cache_info().currsize for f in (mla._launch_plan, gl_large._ws_plan, fm._launch_plan)) > 0
    mla.set_pdl(False)
    assert common._MERGE_PDL_KW == {}
    assert common.PDL is False
    assert mla._launch_plan.cache_info().currsize == 0 and gl_large._ws_plan.cache_info().currsize == 0
    assert fm._launch_plan.cache_info().currsize == 0
    mla.set_pdl(True)
    assert common.PDL is True


def test_builds_carry_the_instructions_only_from_sm90():
    """The shipped split kernel and merge as `compile_report` builds them: the trigger in the split build and the
    wait in the merge on sm_90 / sm_120, neither on sm_80 / sm_89 (ptxas refuses them there), none in the build
    without splits; the sm_90 Gluon builds as launched (`aot_compile`'s default): the trigger in the split and
    balanced builds of the dq and fp8-cache kernels, not in the dq build without splits."""
    rows = compile_rows("""
import json, os
os.environ["GLM5LIB_PDL"] = "1"  # the opt-in builds (the default launches, and so compiles, without PDL)
from glm5lib.kernels.compile_report import compile_spec, shipped_kernels
from glm5lib.kernels import mla_gluon_fp8mma as fm, mla_gluon_large as gl_large
for arch in (80, 89, 90, 120):
    specs = {s.name: s for s in shipped_kernels(arch)}
    split = next(n for n in specs if n.startswith("sparse_mla[small-bf16") and n.endswith(":split]"))
    merge = next(n for n in specs if n.startswith("merge_splits["))
    for name in (split, split.replace(":split]", ":direct]"), merge):
        ptx = compile_spec(specs[name], arch).asm["ptx"]
        print(json.dumps({"arch": arch, "name": name.split("[")[0] + (":split" if name == split else ""),
                          "trigger": "griddepcontrol.launch_dependents" in ptx, "wait": "griddepcontrol.wait" in ptx}))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from glm5lib.kernels.compile_report import _sig
from glm5lib.kernels import mla
merges = (("merge_splits", mla._merge_splits_kernel, {"D_NOPE": 512, "SP": 4, "BLOCK_H": 16, "BLOCK_D": 64}),
          ("merge_pieces", fm._merge_pieces_kernel, {"HP": 8, "BLOCK_D": 128}),
          ("merge_runs", gl_large._merge_runs_kernel, {"D_NOPE": 512, "SP": 4, "BLOCK_H": 16, "BLOCK_D": 64}))
for name, fn, consts in merges:
    for on in (False, True):
        c = dict(consts, PDL=on)
        sig = _sig(fn, {"PART": "*fp32", "O": "*bf16", "LSE": "*fp32"}, c)
        k = triton.compile(ASTSource(fn, sig, constexprs={(fn.arg_names.index(a),): v for a, v in c.items()}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        lines = [l.strip() for l in k.asm["ptx"].splitlines()]
        first = lambda pat: next((i for i, l in enumerate(lines) if pat in l), 10**9)
        print(json.dumps({"arch": 90, "name": f"{name}:{on}", "wait": first("griddepcontrol.wait"),
                          "load": first("ld.global"), "store": first("st.global")}))
for name, k in (("dq:split", gl_large.aot_compile(90, kv_format="fp8_ds_mla", mode="dq", split=True)),
                ("dq:bal", gl_large.aot_compile(90, kv_format="fp8_ds_mla", mode="dq", bal=True)),
                ("dq:direct", gl_large.aot_compile(90, kv_format="fp8_ds_mla", mode="dq")),
                ("fp8mma:split", fm.aot_compile(90, split=True))):
    ptx = k.asm["ptx"]
    print(json.dumps({"arch": 90, "name": name, "trigger": "griddepcontrol.launch_dependents" in ptx,
                      "wait": "griddepcontrol.wait" in ptx}))
from glm5lib.kernels import common
common.PDL = False  # the default: the builds as launched carry neither instruction
specs = {s.name: s for s in shipped_kernels(90)}
split = next(n for n in specs if n.startswith("sparse_mla[small-bf16") and n.endswith(":split]"))
merge = next(n for n in specs if n.startswith("merge_splits["))
for name, k in (("off:sparse_mla:split", compile_spec(specs[split], 90)),
                ("off:merge_splits", compile_spec(specs[merge], 90)),
                ("off:dq:split", gl_large.aot_compile(90, kv_format="fp8_ds_mla", mode="dq", split=True)),
                ("off:fp8mma:split", fm.aot_compile(90, split=True))):
    ptx = k.asm["ptx"]
    print(json.dumps({"arch": 90, "name": name, "trigger": "griddepcontrol.launch_dependents" in ptx,
                      "wait": "griddepcontrol.wait" in ptx}))
""")
    got = {(r["arch"], r["name"]): (r["trigger"], r["wait"]) for r in rows if "trigger" in r}
    for arch in (80, 89, 90, 120):
        on = arch >= 90
        assert got[(arch, "sparse_mla:split")] == (on, False), arch
        assert got[(arch, "sparse_mla")] == (False, False), arch
        assert got[(arch, "merge_splits")] == (False, on), arch
    assert got[(90, "dq:split")] == (True, False) and got[(90, "dq:bal")] == (True, False)
    assert got[(90, "dq:direct")] == (False, False)
    assert got[(90, "fp8mma:split")] == (True, False)
    for name in ("off:sparse_mla:split", "off:merge_splits", "off:dq:split", "off:fp8mma:split"):
        assert got[(90, name)] == (False, False), name
    # each merge with the constexpr on waits before its first load and store; with it off it has no wait
    for name in ("merge_splits", "merge_pieces", "merge_runs"):
        on = next(r for r in rows if r["name"] == f"{name}:True")
        off = next(r for r in rows if r["name"] == f"{name}:False")
        assert on["wait"] < on["load"] < 10**9 and on["wait"] < on["store"] < 10**9, name
        assert off["wait"] == 10**9 and off["load"] < 10**9, name


def test_fp8mma_trigger_place_follows_pdl_trigger(pdl_on, monkeypatch):
    """`mla_gluon_fp8mma.PDL_TRIGGER` sets the constexpr of every launch whose merge follows (1: first thing, 2:
    after the tile loop), and none where no merge follows."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    d = fm.DEFAULT
    args = (2048, "cpu", None, d.nbuf, d.q_terms, d.p_terms, d.maxnreg, d.block_n, d.row_threads, d.refill, d.sched)
    assert fm.PDL_TRIGGER in fm.PDL_TRIGGERS
    monkeypatch.setattr(fm, "PDL_TRIGGER", fm.PDL_TRIGGER)  # restored after the test
    for where in fm.PDL_TRIGGERS:
        fm.set_pdl_trigger(where)  # drops the cached plans: no clear here
        assert fm._launch_plan(32, 8, *args, None)[3]["PDL"] == where  # split decode
        assert fm._launch_plan(600, 8, *args, None, 2048)[3]["PDL"] == where  # balanced prefill (cut tokens)
        assert fm._launch_plan(32, 8, *args, 1)[3]["PDL"] == 0  # no merge
    with pytest.raises(ValueError, match="trigger"):
        fm.set_pdl_trigger(3)
    fm.clear_plans()


def test_fp8mma_late_trigger_sits_after_the_products():
    """The sm_90 PTX of the fp8-cache kernel's split and balanced builds: PDL 1 triggers before the first product,
    PDL 2 after the last one (so its programs trigger once their tile loop is done), 0 not at all."""
    rows = compile_rows("""
import json
from glm5lib.kernels import mla_gluon_fp8mma as fm
for pdl in (0, 1, 2):
    for name, kw in (("split", dict(split=True)), ("balanced", dict(split=False, sched=1))):
        lines = [l.strip() for l in fm.aot_compile(90, pdl=pdl, **kw).asm["ptx"].splitlines()]
        trig = [i for i, l in enumerate(lines) if "griddepcontrol.launch_dependents" in l]
        mma = [i for i, l in enumerate(lines) if l.startswith("mma.sync")]
        print(json.dumps({"pdl": pdl, "name": name, "trig": trig, "first_mma": mma[0], "last_mma": mma[-1]}))
""")
    got = {(r["pdl"], r["name"]): r for r in rows if "trig" in r}
    assert len(got) == 6
    for name in ("split", "balanced"):
        assert got[(0, name)]["trig"] == []
        assert len(got[(1, name)]["trig"]) == 1 and got[(1, name)]["trig"][0] < got[(1, name)]["first_mma"]
        assert len(got[(2, name)]["trig"]) == 1 and got[(2, name)]["trig"][0] > got[(2, name)]["last_mma"]


def test_fp8mma_per_sm_pads_the_launch(monkeypatch):
    """`sparse_mla_fp8mma(per_sm=)` (a measurement knob, `scripts/small_class_probe.py`): the launch carries the
    shared-memory pad that holds an sm_90 GPU to that many programs an SM, and a launcher key that matches it."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    seen = []

    class Launcher:
        def launch(self, grid, args, kw, kw_key, dev, spec):
            seen.append((grid, kw, kw_key))

    monkeypatch.setattr(fm, "_FP8MMA", Launcher())
    monkeypatch.setattr(fm, "_arch", lambda dev: 90)  # as on an H200 (228 KB an SM)
    monkeypatch.setattr(mla, "merge_splits", lambda *a: None)
    T, H = 32, 8
    q = torch.randn(T, H, 576, dtype=torch.bfloat16)
    cache = torch.zeros(3000, 656, dtype=torch.uint8)
    idx = torch.randint(0, 3000, (T, 2048), dtype=torch.int32)
    small = fm.config_kwargs(fm.CONFIG_BY_CLASS["small"])
    est = fm.smem_bytes_estimate(1, small["nbuf"], small["q_terms"], 32, 2)
    for per_sm in (None, 3, 2, 1):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, per_sm=per_sm, **small)
        grid, kw, key = seen[-1]
        assert key == tuple(kw.values())
        if per_sm is None:
            assert kw["PAD"] == 0
        else:
            assert kw["PAD"] == fm.pad_words(est, per_sm, "big") > 0
            assert fm.SMEM_PER_SM["big"] // (est + 4 * kw["PAD"] + 2048) == per_sm
    assert len({s[1]["PAD"] for s in seen}) == 4
    with pytest.raises(ValueError, match="per_sm"):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, per_sm=0, **small)
