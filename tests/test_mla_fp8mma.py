"""The fp8-product sparse-MLA kernel (`kernels.mla_gluon_fp8mma`) without a GPU.

Gluon does not run in Triton's interpreter: its numerics are checked on the H200 (`scripts/fp8mma_device.py`,
`checks --profile full`; the committed results are held by `tests/test_evidence.py`). Here:
- every config compiles for sm_89 / sm_90 / sm_120 (child process, interpreter off) without spills and within the
  target's shared memory; each build also proves the layout claims the kernel makes, since its operand loads are
  `convert_layout(..., assert_trivial=True)` and fail to compile if any element would have to cross threads;
- the column and row orders the kernel uses (`_k_logical`, `_k_logical16`, `_v_logical`, `_d_order`) are bit
  permutations with the properties the docstrings state, checked with torch on the same reshape / permute orders;
- the dispatch rule and its switch, and the launcher's refusals of bad input.
"""

from __future__ import annotations

import pytest
import torch
from compiled import compile_rows

from glm5lib.kernels import mla, mla_gluon_fp8mma as fm

pytestmark = pytest.mark.skipif(not fm.HAVE_GLUON, reason="this Triton has no Gluon")

_SCRIPT = """
import json
from glm5lib.kernels import mla_gluon_fp8mma as m
for arch in (89, 90, 120):
    for G in (1, 2):
        # every config with split partials (decode); the shipped ones also without (prefill)
        # (a balanced build's split build is its one-a-token one; without splits a shipped balanced build is compiled
        # both ways, since prefills of up to a wave's tokens, and index rows not back to back, take one a token)
        shipped = list(m.CONFIG_BY_CLASS.values())
        builds = ([(cfg, True) for cfg in m.CONFIGS if not cfg.sched] + [(cfg, False) for cfg in shipped]
                  + [(cfg._replace(sched=0), False) for cfg in shipped if cfg.sched])
        for cfg, split in builds:
            try:
                r = m.compile_stats(arch, G, **m.config_kwargs(cfg), split=split)
            except Exception as exc:
                r = {"config": m.config_name(cfg), "arch": arch, "G": G, "split": split, "error": str(exc)[-400:]}
            print(json.dumps(r), flush=True)
"""


@pytest.fixture(scope="module")
def stats():
    return compile_rows(_SCRIPT, timeout=1500)


def _key(r):
    return f"sm_{r['arch']} G{r['G']} {r['config']}{'' if r['split'] else ' no-split'}"


# the balanced schedule's builds keep a few per-piece values on the stack across their tile loop: under Triton 3.6,
# what the H200 runs, 8 B and none reloaded in the tile loop; under this Triton (3.9) 48 B, and 7 loads a tile of
# values spilled before the loop (no store in it), where the one-a-token build has 2
_BALANCED_STACK = 64
_BALANCED_LOOP_SPILLS = 8


# the split build over 64-key tiles at two key warps and 1-8 heads (a measurement config: the shipped plan splits over
# 32-key tiles) under `GATHER_SCALES` 1 on sm_90: this Triton (3.9) gives it 255 registers, 16 B of stack and 1 spill
# instruction in its tile loop (243 registers, none, in mode 0; 9-16 heads 253, none); Triton 3.6, what the H200 runs,
# 249 registers and no stack in mode 1 (252 in mode 0). Counted in round 33 with `compile_stats`
_SPLIT64_LOOP_SPILLS = {("fp8mma-nbufG-f16-n64", 90, True, 1): 1}


def _base(name: str) -> str:
    """A config name without its S-product and key-warps suffixes (`config_name`: "-wg", "-wga", "-wgplan"; "-k4",
    "-kplan")."""
    for s in ("-wgplan", "-wga", "-wg"):
        name = name.removesuffix(s)
    return name.removesuffix("-kplan").removesuffix("-k4")


def _balanced(r) -> bool:
    return _base(r["config"]).endswith("-b") and not r["split"]


def test_every_config_compiles_for_every_target(stats):
    shipped = list(fm.CONFIG_BY_CLASS.values())
    n = sum(not c.sched for c in fm.CONFIGS) + len(shipped) + sum(bool(c.sched) for c in shipped)
    assert len(stats) == 3 * 2 * n
    # the shipped sm_90 build without splits, both schedules
    names = {(r["config"], r["split"]) for r in stats}
    big = fm.CONFIG_BY_CLASS["big"]
    assert {(fm.config_name(big), False), (fm.config_name(big._replace(sched=0)), False)} <= names
    bad = [f"{_key(r)}: {r['error']}" for r in stats if "error" in r]
    assert not bad, "; ".join(bad)


def test_shipped_configs_spill_nothing_and_fit(stats):
    shipped = {fm.config_name(c) for c in fm.CONFIG_BY_CLASS.values()}
    for r in stats:
        # every build fits sm_90; on the 99 KB class every build the estimate (the split rule's count) says fits
        # (the 64-key build of 16 heads, two 42 KB slots, does not)
        if r["arch"] == 90 or r["estimate"] + 1024 <= r["limit"]:
            assert r["fits"], f"{_key(r)}: {r['shared']} B > {r['limit']} B"
        assert r["estimate"] <= r["shared"] <= r["estimate"] + 1024, _key(r)  # the estimate is the compiler's count
        if r["config"] in shipped and r["G"] == 1:  # the shipped 1-8-head builds spill nothing in their loop, and
            # only the early refill's 64-key build (one split) keeps a few bytes on the stack (Triton 3.6, what the
            # H200 runs: 8 B, none in the loop; this Triton's build: up to 24 B and 2 spill instructions in the loop)
            early = fm.refill_mode(fm.CONFIG_BY_CLASS["big"].refill, 0, 1, 2 if r["split"] else 1)
            early = early and "-eplan" in r["config"]
            allowed = _BALANCED_LOOP_SPILLS if _balanced(r) else 4 if early else 0
            assert not r["local"] and r.get("loop_spills", 0) <= allowed, f"{_key(r)} spills in its loop"
            assert r["stack"] <= (_BALANCED_STACK if _balanced(r) else 32 if early else 0), \
                f"{_key(r)}: {r['stack']} B of stack"
        if "-r" not in r["config"]:  # builds without a register cap spill nothing in their main loop (the 64-key
            # build of 16 heads keeps 16 bytes on the stack outside it; an early-refill build at most 4 instructions)
            allowed = (_BALANCED_LOOP_SPILLS if _balanced(r) else
                       4 if _base(r["config"]).endswith(("-e", "-eplan", "-e-b", "-eplan-b")) else
                       _SPLIT64_LOOP_SPILLS.get((r["config"], r["arch"], r["split"], r["G"]), 0))
            assert not r["local"] and r.get("loop_spills", 0) <= allowed, f"{_key(r)} spills in its loop"
            split64 = (r["config"], r["arch"], r["split"], r["G"]) in _SPLIT64_LOOP_SPILLS
            assert r["stack"] <= (_BALANCED_STACK if _balanced(r) else 32 if allowed and not split64 else 16), \
                f"{_key(r)}: {r['stack']} B of stack"
        else:  # a capped build holds its cap (the split rule counts programs per SM by it)
            assert r["regs"] <= int(r["config"].rsplit("-r", 1)[1]), _key(r)
    assert shipped and not any("-r" in name for name in shipped)
    # the 99 KB class's build leaves room for three programs of 8 heads per SM
    small = [r for r in stats if r["config"] == fm.config_name(fm.CONFIG_BY_CLASS["small"]) and r["arch"] == 120]
    assert small and all(3 * (r["shared"] + 1024) <= 100 * 1024 for r in small if r["G"] == 1)


def _bits(perm: torch.Tensor) -> list[int]:
    """For a bit permutation p of range(2^n): the image of each single bit (p[2^b])."""
    n = perm.numel().bit_length() - 1
    return [int(perm[1 << b]) for b in range(n)]


# the kernel's bit permutations as data, without the row (or head) dimension: reshape sizes after the chunk, and the
# permute order; `test_permutations_are_the_kernels` holds them to the kernel's source
K_E4M3 = ((2, 2, 2, 2, 2, 4), (0, 3, 4, 5, 1, 2, 6))  # `_k_logical`
K_F16 = ((2, 2, 2, 2, 2, 2, 2), (0, 3, 4, 5, 6, 1, 2, 7))  # `_k_logical16`
V_ROWS = (4, 5, 0, 6, 1, 2, 3)  # `_v_logical`'s order over the 7 bits of a chunk's column (two key warps)
D_ROWS = (2, 4, 5, 6, 0, 1, 3)  # `_d_order`: its inverse
V_ROWS4 = (5, 0, 1, 6, 2, 3, 4)  # the same with four key warps (`Config.key_warps`)
D_ROWS4 = (1, 2, 4, 5, 6, 0, 3)
# product column k -> memory byte p of the latent row (512 bytes: 4 chunks)
K_ORDER_E4M3 = torch.arange(512).reshape(4, *K_E4M3[0]).permute(*K_E4M3[1]).reshape(512)
K_ORDER_F16 = torch.arange(512).reshape(4, *K_F16[0]).permute(*K_F16[1]).reshape(512)


def _kernel_lists(fn, call: str) -> list[list[int]]:
    """The integer lists passed to `gl.<call>(x, [...])` in a Gluon function's source, in order."""
    import inspect
    import re

    src = inspect.getsource(fn.fn)
    return [[int(v) for v in re.findall(r"-?\d+", m)] for m in re.findall(rf"gl\.{call}\(\w+, \[([^\]]*)\]", src)]


def test_permutations_are_the_kernels():
    # the kernel's lists carry the row dimension first (K) or the key / head dimension last (V^T rows, O rows)
    for fn, (dims, perm) in ((fm._k_logical, K_E4M3), (fm._k_logical16, K_F16)):
        shapes, perms = _kernel_lists(fn, "reshape"), _kernel_lists(fn, "permute")
        assert shapes[0][-len(dims):] == list(dims) and perms == [[0] + [p + 1 for p in perm]], fn.fn.__name__
    assert _kernel_lists(fm._v_logical, "permute") == [[1, 0], list(V_ROWS4) + [7], list(V_ROWS) + [7]]
    assert _kernel_lists(fm._d_order, "permute") == [list(D_ROWS4) + [7], list(D_ROWS) + [7]]


def _thread_units(order: torch.Tensor, owned) -> dict:
    """{(c, half): 16-byte unit of the row} the operand thread of lane % 4 = c reads in each of its two 16-byte
    loads of chunk 0 (owned(c): its columns of the chunk); each load must be 16 contiguous, aligned bytes."""
    out = {}
    for c in range(4):
        mem = sorted(int(order[k]) for k in owned(c))
        assert mem == list(range(mem[0], mem[0] + 32)) and mem[0] % 32 == 0, (c, mem[:4])
        out[(c, 0)], out[(c, 1)] = mem[0] // 16, mem[0] // 16 + 1
    return out


@pytest.mark.parametrize("build", ["e4m3", "f16"])
def test_k_operand_loads_have_no_bank_conflicts(build):
    # the tile's rows are 512 bytes (bank group 0 at every row start) with 16-byte units XOR-swizzled by row % 8
    # (SW8). A quarter-warp (8 lanes: rows g = 2q, 2q + 1, c = 0..3) must hit 8 different bank groups per load
    if build == "e4m3":
        order, owned = K_ORDER_E4M3, lambda c: [32 * s + 16 * h + 4 * c + b for s in range(4) for h in (0, 1)
                                                for b in range(4)]
    else:
        order, owned = K_ORDER_F16, lambda c: [16 * s + 8 * h + 2 * c + b for s in range(8) for h in (0, 1)
                                               for b in (0, 1)]
    units = _thread_units(order, owned)
    for half in (0, 1):
        for q in range(4):
            for row8 in (0, 8):  # the register's second row (g + 8)
                groups = [(units[(c, half)] ^ ((row8 + g) % 8)) % 8 for g in (2 * q, 2 * q + 1) for c in range(4)]
                assert sorted(groups) == list(range(8)), (build, half, q, groups)


def test_k_columns_are_a_bit_permutation_giving_each_thread_16_contiguous_bytes():
    # `_k_logical`: product column k (of 512) -> memory byte p, the same reshape / permute as the kernel's
    p = K_ORDER_E4M3
    assert sorted(p.tolist()) == list(range(512))
    assert all(int(p[k]) == sum(int(p[1 << b]) for b in range(9) if k >> b & 1) for k in range(512))  # linear
    # an m16n8k32 e4m3 operand thread (lane % 4 = c) owns columns 4c..4c+3 and 4c+16..4c+19 of each 32-column step;
    # two steps' worth must be 16 contiguous bytes of the row, inside one 128-column chunk (its scale)
    for c in range(4):
        for step2 in range(8):
            cols = [64 * step2 + 32 * s + 16 * h + 4 * c + b for s in (0, 1) for h in (0, 1) for b in range(4)]
            mem = sorted(int(p[k]) for k in cols)
            assert mem == list(range(mem[0], mem[0] + 16)) and mem[0] // 128 == mem[-1] // 128


def test_k16_columns_give_each_thread_its_fp16_operand_pairs_in_16_contiguous_bytes():
    # `_k_logical16`: product column k -> memory element p, the same reshape / permute as the kernel's
    p = K_ORDER_F16
    assert sorted(p.tolist()) == list(range(512))
    mem_of = {k: int(p[k]) for k in range(512)}
    # an m16n8k16 operand thread (lane % 4 = c) owns columns 2c, 2c + 1, 2c + 8, 2c + 9 of each 16-column step;
    # four steps' worth must be 16 contiguous bytes of one chunk, and each pair (2c + j, 2c + j + 1) two neighbouring
    # bytes, the low one first (one cvt.rn.f16x2.e4m3x2 gives the operand's fp16x2 register)
    for c in range(4):
        for step4 in range(8):
            cols = [64 * step4 + 16 * s + 8 * h + 2 * c + b for s in range(4) for h in (0, 1) for b in (0, 1)]
            mem = sorted(mem_of[col] for col in cols)
            assert mem == list(range(mem[0], mem[0] + 16)) and mem[0] // 128 == mem[-1] // 128
            for s_ in range(4):
                for h in (0, 1):
                    lo = mem_of[64 * step4 + 16 * s_ + 8 * h + 2 * c]
                    assert mem_of[64 * step4 + 16 * s_ + 8 * h + 2 * c + 1] == lo + 1 and lo % 2 == 0


@pytest.mark.parametrize("v_rows, d_rows, warps, offsets", [
    (V_ROWS, D_ROWS, 2, (0, 8, 32, 40, 64, 72, 96, 104)),
    (V_ROWS4, D_ROWS4, 4, (0, 8, 64, 72))])
def test_v_rows_and_their_inverse(v_rows, d_rows, warps, offsets):
    # `_v_logical`: V^T row m -> memory column d inside a chunk; `_d_order` must put the rows back
    d = torch.arange(128).reshape(2, 2, 2, 2, 2, 2, 2).permute(*v_rows).reshape(128)
    assert sorted(d.tolist()) == list(range(128))
    back = d.reshape(2, 2, 2, 2, 2, 2, 2).permute(*d_rows).reshape(128)
    assert torch.equal(back, torch.arange(128))
    # the NVMMA layout over `warps` warps along M: warp w holds rows 16 w + {0..15} (+ 32 or 64 per repeat), the
    # operand thread with lane // 4 = g rows g + {0, 8} of each m16 tile: contiguous bytes of each of its keys
    # (8 at two key warps, 4 at four), and warp w the chunk's columns 128 / warps * w onwards (what its early refill
    # copied in `REFILL_ROWS` mode 0)
    n = len(offsets)
    for g in range(8):
        for warp in range(warps):
            rows = [g + 16 * warp + r for r in offsets]
            mem = sorted(int(d[m]) for m in rows)
            assert mem == list(range(mem[0], mem[0] + n)) and mem[0] // (128 // warps) == warp


def test_out_layout_with_four_key_warps():
    # the store layout after `_d_order` (`_out_layout(16, 4)`): its bases as memory positions (d, head)
    L = fm._out_layout(16, 4)
    assert L.warp_bases == [[32, 0], [64, 0]] and L.reg_bases[:2] == [[1, 0], [2, 0]]


def _exp_to_max(amax: float) -> int:
    """The host twin of `_exp_to_max` (the kernel reads fp32 bits; here the same rule in integers)."""
    import struct

    if amax <= 0:
        return 0
    bits = struct.unpack("<i", struct.pack("<f", amax))[0]
    return max(-126, min(126, 135 - (bits >> 23) - ((bits & 0x7FFFFF) > 0x600000)))


@pytest.mark.parametrize("amax", [448.0, 447.9, 448.1, 1.75, 1.7500001, 1.0, 3.5, 1e-3, 255.0, 256.0, 0.0])
def test_power_of_two_never_overflows_e4m3_and_is_the_largest(amax):
    e = _exp_to_max(amax)
    if amax == 0:
        assert e == 0
        return
    assert amax * 2.0 ** e <= 448.0 < amax * 2.0 ** (e + 1)


def test_dispatch_rule_and_switch(monkeypatch):
    assert mla.fp8mma_shape(32, 8, "fp8_ds_mla") and mla.fp8mma_shape(4096, 1, "fp8_ds_mla")
    assert not mla.fp8mma_shape(31, 8, "fp8_ds_mla")  # fewer tokens: not timed, stays on Triton
    # under CUDA-graph capture (no host time replayed) from 8 tokens, still 1-16 heads over fp8_ds_mla only
    assert mla.fp8mma_shape(8, 8, "fp8_ds_mla", graph=True) and mla.fp8mma_shape(31, 16, "fp8_ds_mla", True)
    assert not mla.fp8mma_shape(7, 8, "fp8_ds_mla", True) and not mla.fp8mma_shape(16, 17, "fp8_ds_mla", True)
    assert not mla.fp8mma_shape(16, 8, "bf16", True)
    assert not mla.capturing(torch.device("cpu"))
    assert mla.fp8mma_shape(128, 16, "fp8_ds_mla") and mla.fp8mma_shape(64, 13, "fp8_ds_mla")
    assert not mla.fp8mma_shape(128, 17, "fp8_ds_mla") and not mla.fp8mma_shape(128, 8, "bf16")
    cpu = torch.device("cpu")
    assert mla.fp8mma_route(128, 8, "fp8_ds_mla", cpu, torch.bfloat16) is None  # no GPU: the Triton kernel
    for value, mode in (("", "auto"), ("auto", "auto"), ("1", "on"), ("on", "on"), ("0", "off"), ("off", "off")):
        monkeypatch.setenv("GLM5LIB_FP8MMA", value)
        assert mla.fp8mma_mode() == mode
    monkeypatch.setenv("GLM5LIB_FP8MMA", "sometimes")
    with pytest.raises(ValueError, match="GLM5LIB_FP8MMA"):
        mla.fp8mma_mode()
    # what the evidence reader and the case matrix record for the shape
    from glm5lib.bench import evidence

    assert evidence._key("prefill:T600-H8-K2048-N32768-fp8_ds_mla-none") == ("small-fp8mma", "fp8_ds_mla", "big")
    # the forced 99 KB class stands for sm_89 / sm_120, where the kernel is not taken unless asked for
    assert evidence._key("prefill:T600-H8-K2048-N32768-fp8_ds_mla-none", "small") == ("prefill-small", "fp8_ds_mla",
                                                                                       "small")
    assert evidence._key("regular:T1-H8-K2048-N32768-fp8_ds_mla-none")[0] == "small"
    assert evidence.shipped_configs()["small-fp8mma/fp8_ds_mla/big"] == fm.config_name(fm.CONFIG_BY_CLASS["big"])


def test_launcher_refuses_bad_input():
    q = torch.zeros(2, 8, 576, dtype=torch.bfloat16)
    cache = torch.zeros(100, 656, dtype=torch.uint8)
    idx = torch.zeros(2, 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="1-16 heads"):
        fm.sparse_mla_fp8mma(torch.zeros(2, 17, 576, dtype=torch.bfloat16), cache, idx, 0.0625)
    with pytest.raises(ValueError, match="q must be"):
        fm.sparse_mla_fp8mma(torch.zeros(2, 8, 512, dtype=torch.bfloat16), cache, idx, 0.0625)
    with pytest.raises(ValueError, match="fp8_ds_mla cache"):
        fm.sparse_mla_fp8mma(q, torch.zeros(100, 576, dtype=torch.bfloat16), idx, 0.0625)
    with pytest.raises(ValueError, match="indices must be int32"):
        fm.sparse_mla_fp8mma(q, cache, idx.long(), 0.0625)
    with pytest.raises(ValueError, match="q_terms and p_terms"):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, q_terms=4)
    with pytest.raises(ValueError, match="q_terms and p_terms"):  # one fp16 term for q and e4m3 terms for P: no build
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, q_terms=1, p_terms=2)
    with pytest.raises(ValueError, match="nbuf"):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, nbuf=-1)
    with pytest.raises(ValueError, match="DEBUG record"):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, q_terms=1, p_terms=1, debug=torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="refill must be one of"):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, refill=3)
    with pytest.raises(ValueError, match="DEBUG record"):  # the record reads the slot in row order
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, q_terms=2, p_terms=2, refill=1,
                             debug=torch.zeros(1, dtype=torch.uint8))


def test_early_refill_rule_and_its_copies():
    # the early refill where the ring has one slot and one head group; elsewhere the slot is refilled whole; the
    # plan's rule (2) early at one split only
    assert [fm.refill_mode(1, nbuf, 1, 4) for nbuf in (0, 1, 2)] == [1, 1, 0]
    assert fm.refill_mode(1, 0, 2, 1) == 0 and fm.refill_mode(0, 1, 1, 1) == 0
    assert [fm.refill_mode(2, 0, 1, s) for s in (1, 2, 8)] == [1, 0, 0] and fm.refill_mode(2, 0, 2, 1) == 0
    assert fm.CONFIG_BY_CLASS["big"].refill == 2 and fm.CONFIG_BY_CLASS["small"].refill == 0
    # mode 0: each warp's latent copy of a chunk is the value columns it read in its P V product (LV's warp basis:
    # warp 1 reads the chunk's columns 64-127), so that no warp overwrites bytes the other may still read
    import inspect
    import re

    L = fm._refill_layout(2, 0)
    words_a_warp = L.size_per_thread[1] * L.threads_per_warp[1]
    assert L.warps_per_cta == [1, 2] and L.order == [1, 0] and 4 * words_a_warp * 2 == 128
    src = inspect.getsource(fm._sparse_mla_fp8mma_kernel.fn)
    wbv = re.findall(r"WBV: gl.constexpr = (.*) if G == 2 else (.*)", src)
    assert wbv and wbv[0][1].strip() == f"[[0, {4 * words_a_warp}]]", wbv
    # the copies are whole 16-byte units with every row's chunk covered once: 8 rows x 4 units a warp's instruction
    assert L.size_per_thread == [1, 4] and L.threads_per_warp[0] * L.threads_per_warp[1] == 32
    # modes 1 and 2 (2 ships): a row's whole 128-byte chunk by 8 threads of one warp, 4 rows an instruction, the warps
    # along the rows; their copies come after a barrier of their own
    R = fm._refill_layout(2, 1)
    assert R.size_per_thread == [1, 4] and R.threads_per_warp == [4, 8] and R.warps_per_cta == [2, 1]
    assert 4 * R.size_per_thread[1] * R.threads_per_warp[1] == 128
    assert fm.REFILL_ROWS == 2 and fm.REFILL_ROWS_MODES == (0, 1, 2)
    body = inspect.getsource(fm._refill_chunk.fn)
    assert re.search(r"if ROWS:\n(\s*#.*\n)*\s*_barrier\(\)", body), body
    with pytest.raises(ValueError, match="copy mode"):
        fm.set_refill_rows(3)


@pytest.fixture
def h200_plan(monkeypatch):
    """`_launch_plan` of the shipped config for top-k 2048 rows back to back, as an H200 (132 SMs, the big
    shared-memory class) would plan it: host work, no GPU; the cached plans are dropped before and after."""
    monkeypatch.setattr(fm, "num_sms", lambda dev: 132)
    monkeypatch.setattr(mla, "smem_class", lambda dev: "big")
    fm.clear_plans()

    def plan(T, H=8, decode=False):
        return fm.config_plan(fm.DEFAULT, T, H, 2048, "cpu", None, 2048, decode)

    yield plan
    monkeypatch.undo()
    fm.clear_plans()


def test_launch_plans_take_the_refill_rows_mode(h200_plan):
    # the launcher passes `REFILL_ROWS` to the builds that refill early (a prefill's one-split plan at 8 heads) and 0
    # elsewhere (a decode batch's split plan), and `set_refill_rows` drops the cached plans, so the next call takes
    # the new mode
    try:
        for mode in (2, 1, 0):
            fm.set_refill_rows(mode)
            splits, _, grid, kw, _ = h200_plan(4096)
            assert (splits, grid, kw["REFILL"], kw["ROWS"]) == (1, (528,), 1, mode)
            splits, _, _, kw, _ = h200_plan(128, decode=True)
            assert splits > 1 and kw["REFILL"] == 0 and kw["ROWS"] == 0
    finally:
        fm.set_refill_rows(2)


_REFILL_ROWS_SCRIPT = """
import json
from glm5lib.kernels import mla_gluon_fp8mma as m
from glm5lib.kernels.compile_report import cuobjdump, sass_loop
for arch in (89, 90, 120):
    for rows in (0, 1, 2):
        k = m.aot_compile(arch, 1, **m.config_kwargs(m.CONFIG_BY_CLASS["big"]), split=False, rows=rows)
        n, _, hist = sass_loop(cuobjdump(k.asm["cubin"], "-sass"), nops=True, inner=True)
        print(json.dumps({"arch": arch, "rows": rows, "n": n, "bar": hist.get("BAR", 0),
                          "ldgsts": hist.get("LDGSTS", 0), "shared": k.metadata.shared,
                          "halves": "threadsPerWarp = [8, 4], warpsPerCTA = [1, 2]" in k.asm["ttgir"],
                          "row_copies": "threadsPerWarp = [4, 8], warpsPerCTA = [2, 1]" in k.asm["ttgir"]}),
              flush=True)
cfg = m.CONFIG_BY_CLASS["big"]._replace(sched=0)  # the measurement's grid: one program a token
for rows in (0, 1, 2):
    m.REFILL_ROWS = rows
    k = m.aot_compile_part(90, m.REFILL_ABLATION, 1, cfg, split=False)
    hist = sass_loop(cuobjdump(k.asm["cubin"], "-sass"), nops=True)[2]
    print(json.dumps({"part": "refill", "rows": rows, "bar": hist.get("BAR", 0), "ldgsts": hist.get("LDGSTS", 0),
                      "shared": k.metadata.shared}), flush=True)
"""


def test_refill_rows_builds_keep_the_tile_loops_barriers_and_copies():
    # the shipped 1-8-head prefill build (one split, early refill, balanced schedule) with each copy mode, compiled
    # for sm_89 / sm_90 / sm_120 (child process, interpreter off): the explicit barrier before each chunk's copies in
    # modes 1 and 2 adds none to the tile loop (the compiler's shared-memory barrier analysis had one there already,
    # since the chunk's allocation was read before), modes 0 and 1 issue as many copies (the same bytes, grouped by
    # rows instead of by halves), and mode 2 three fewer a thread (a row's four 4-byte scale copies become one of 16
    # bytes, one row a thread); a loop without barriers or copies, or a mode not taken, would fail the counts
    out = compile_rows(_REFILL_ROWS_SCRIPT, timeout=900)
    rows = {(r["arch"], r["rows"]): r for r in out if "arch" in r}
    # the measurement of the copies alone (`ablate_launch`'s "refill") issues the kernel's copies of a tile in each
    # mode, its barriers only in modes 1-2 (mode 0's came from the kernel's reads), and holds 4 programs an SM
    alone = {r["rows"]: r for r in out if r.get("part") == "refill"}
    assert set(alone) == {0, 1, 2}
    for mode, r in alone.items():
        assert r["ldgsts"] == rows[90, mode]["ldgsts"], (mode, r)
        assert r["bar"] == (2 if mode == 0 else 5), (mode, r)  # the wait's, then the compiler's one or one a chunk
        assert fm.SMEM_PER_SM["big"] // (r["shared"] + 2048) == 4, r
    for arch in (89, 90, 120):
        a, b, c = rows[arch, 0], rows[arch, 1], rows[arch, 2]
        # the copy layout each mode takes (TTGIR): mode 0's halves by warp, modes 1-2's rows by warp
        assert a["halves"] and not b["halves"] and not c["halves"] and b["row_copies"] and c["row_copies"], arch
        assert a["bar"] == b["bar"] == c["bar"] >= 6, (a, b, c)  # the ring's, P^T's and one a latent chunk
        assert a["ldgsts"] == b["ldgsts"] >= 4 * 8 + 4, (a, b)  # 8 a thread a chunk, the rope's and 4 scales'
        assert c["ldgsts"] == b["ldgsts"] - 3, (b, c)
        assert a["shared"] == b["shared"] == c["shared"]
        assert abs(a["n"] - b["n"]) <= 0.02 * a["n"], (a, b)


def test_scale_rows_layout_gives_each_row_its_16_bytes_once():
    # `GATHER_SCALES` 1 and `REFILL_ROWS` 2: [BN, 4] fp32 scales over a program's 32 NW threads, each row's 16 bytes
    # by 32 NW / BN threads of one warp, each thread a contiguous piece; every element held by exactly one thread
    # (a duplicate would copy the same bytes twice, from two threads); enumerated from the layout's parameters
    for NW, BN in ((2, 64), (2, 32), (4, 64), (4, 32)):
        L = fm._scale_rows_layout(NW, BN)
        assert L.order == [1, 0] and L.warps_per_cta == [NW, 1] and L.size_per_thread[0] == 1
        spt, (tpw0, tpw1) = L.size_per_thread[1], L.threads_per_warp
        seen = {}
        for w in range(NW):
            for lane in range(32):
                r = w * tpw0 + lane // tpw1
                for c in range((lane % tpw1) * spt, (lane % tpw1 + 1) * spt):
                    seen.setdefault((r, c), []).append((w, lane))
        assert sorted(seen) == [(r, c) for r in range(BN) for c in range(4)], (NW, BN)
        assert all(len(v) == 1 for v in seen.values()), (NW, BN)
        assert 4 * spt * tpw1 == 16 and 4 * spt in (4, 8, 16)  # a row's 16 bytes in 1, 2 or 4 copies
    for NW, BN in ((2, 128), (4, 16)):  # more rows than threads, or more than 4 threads a row
        with pytest.raises(AssertionError, match="scale-row layout"):
            fm._scale_rows_layout(NW, BN)
    assert fm.GATHER_SCALES_MODES == (0, 1) and fm.GATHER_SCALES in fm.GATHER_SCALES_MODES
    with pytest.raises(ValueError, match="scale-copy mode"):
        fm.set_gather_scales(2)


def test_launch_plans_take_the_gather_scales_mode(h200_plan):
    # every plan passes `GATHER_SCALES` (the kernel applies it where the ring is filled whole; an early build's
    # scales follow `REFILL_ROWS`), and `set_gather_scales` drops the cached plans
    shipped = fm.GATHER_SCALES
    try:
        for mode in (1, 0, 1):
            fm.set_gather_scales(mode)
            for T, H, decode in ((128, 8, True), (32, 16, True), (4096, 16, False), (4096, 8, False)):
                assert h200_plan(T, H, decode)[3]["GSCALES"] == mode, (mode, T, H)
    finally:
        fm.set_gather_scales(shipped)


_GATHER_SCALES_SCRIPT = """
import json
from glm5lib.kernels import mla_gluon_fp8mma as m
from glm5lib.kernels.compile_report import cuobjdump, sass_loop
big, small = m.CONFIG_BY_CLASS["big"], m.CONFIG_BY_CLASS["small"]
# the split decode at 8 heads (four key warps, 64-key tiles) and 16 (two head groups, 32-key tiles), the 16-head
# prefill (four key warps), the 8-head prefill (early refill: not a whole-tile build), the 99 KB class's decode
builds = [(90, "dec8", big, 1, True), (90, "dec16", big, 2, True), (90, "pre16", big, 2, False),
          (90, "pre8", big, 1, False), (89, "small8", small, 1, True), (120, "small16", small, 2, True)]
for arch, name, cfg, G, split in builds:
    for g in (0, 1):
        k = m.aot_compile(arch, G, **m.config_kwargs(cfg), split=split, gscales=g)
        n, _, hist = sass_loop(cuobjdump(k.asm["cubin"], "-sass"), nops=True, inner=True)
        print(json.dumps({"arch": arch, "build": name, "g": g, "n": n, "bar": hist.get("BAR", 0),
                          "ldgsts": hist.get("LDGSTS", 0), "shared": k.metadata.shared,
                          "layouts": [t for t in ("[32, 1]", "[16, 2]", "[8, 4]")
                                      if "sizePerThread = [1, %d], threadsPerWarp = %s" % (4 // int(t[-2]), t)
                                      in k.asm["ttgir"]]}), flush=True)
for g in (0, 1):
    m.GATHER_SCALES = g
    k = m.aot_compile_part(90, "gathers", 1, big, split=True)
    n, _, hist = sass_loop(cuobjdump(k.asm["cubin"], "-sass"), nops=True)
    print(json.dumps({"part": "gathers", "g": g, "bar": hist.get("BAR", 0), "ldgsts": hist.get("LDGSTS", 0),
                      "shared": k.metadata.shared}), flush=True)
"""


def test_gather_scales_builds_drop_the_row_id_conversion():
    # the whole-tile builds compiled in each `GATHER_SCALES` mode (child process, interpreter off; sm_90 and the
    # 99 KB class's sm_89 / sm_120): mode 1 reads the scale copies' row ids in their own layout, so the conversion's
    # shared-memory round trip and its 3 barriers leave the tile loop, and copies a row's scales in 1-4 copies a row
    # (one copy instruction fewer a thread where 2 threads share a row, as many where 4 do); its [BN, 4] copy layout
    # is in the TTGIR. The early-refill build (8-head prefill) does not gather whole tiles: the same SASS either way.
    # The measurement of the gathers alone (`ablate_launch`'s "gathers") copies as the kernel does in each mode.
    out = compile_rows(_GATHER_SCALES_SCRIPT, timeout=900)
    rows = {(r["build"], r["g"]): r for r in out if "build" in r}
    per_row = {"dec8": 2, "dec16": 4, "pre16": 2, "small8": 2, "small16": 4}  # threads a row's scales
    for name, tpr in per_row.items():
        a, b = rows[name, 0], rows[name, 1]
        assert b["bar"] == a["bar"] - 3 >= 1, (a, b)
        assert b["ldgsts"] == a["ldgsts"] - (1 if tpr == 2 else 0), (a, b)
        assert b["shared"] <= a["shared"] and b["n"] < a["n"], (a, b)
        assert a["layouts"] == [] and b["layouts"] == [{1: "[32, 1]", 2: "[16, 2]", 4: "[8, 4]"}[tpr]], (a, b)
    a, b = rows["pre8", 0], rows["pre8", 1]
    assert (a["n"], a["bar"], a["ldgsts"], a["shared"]) == (b["n"], b["bar"], b["ldgsts"], b["shared"])
    parts = {r["g"]: r for r in out if r.get("part") == "gathers"}
    for g in (0, 1):
        assert parts[g]["ldgsts"] == rows["dec8", g]["ldgsts"], parts
    assert parts[1]["bar"] == parts[0]["bar"] - 3, parts


def test_configs_name_their_builds():
    assert fm.config_name(fm.Config(0, 1, 1)) == "fp8mma-nbufG-f16"
    assert fm.config_name((2, 2, 2)) == "fp8mma-nbuf2-q2-p2"
    assert fm.config_name((1, 1, 1, 168)) == "fp8mma-nbuf1-f16-r168"
    assert len({fm.config_name(c) for c in fm.CONFIGS}) == len(fm.CONFIGS)
    assert fm.config_name((0, 1, 1, 0, 64)) == "fp8mma-nbufG-f16-n64"
    assert fm.config_name(fm.CONFIG_BY_CLASS["big"]) == "fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan-wgplan"
    assert fm.config_name((1, 1, 1, 0, 0, 8, 2, 0, 4)) == "fp8mma-nbuf1-f16-nplan-t8-eplan-k4"
    assert fm.config_kwargs((1, 1, 1)) == {"nbuf": 1, "q_terms": 1, "p_terms": 1, "maxnreg": 0, "block_n": 32,
                                           "row_threads": 0, "refill": 0, "sched": 0, "key_warps": 2, "widen": 0,
                                           "wgmma": 0}
    assert fm.config_name((0, 1, 1, 0, 0, 8, 1)) == "fp8mma-nbufG-f16-nplan-t8-e"
    assert fm.config_name((0, 1, 1, 0, 0, 8)) == "fp8mma-nbufG-f16-nplan-t8"
    assert fm.config_name((1, 2, 2, 0, 32, 8)) == "fp8mma-nbuf1-q2-p2-t8"
    assert all(c.row_threads == 8 for c in fm.CONFIG_BY_CLASS.values())
    # nbuf 0: one ring slot per head group, in the shared-memory estimate too
    assert [fm.ring_slots(0, G) for G in (1, 2)] == [1, 2] and fm.ring_slots(2, 1) == 2
    assert fm.smem_bytes_estimate(1, 0, 1) == fm.smem_bytes_estimate(1, 1, 1)
    assert fm.smem_bytes_estimate(2, 0, 1) == fm.smem_bytes_estimate(2, 2, 1)
    # q's fp16 copy takes as many bytes as two e4m3 terms
    assert fm.smem_bytes_estimate(1, 1, 1) == fm.smem_bytes_estimate(1, 1, 2)
    # a 64-key tile doubles the ring; the rule's build is counted at its larger tile
    ring = 32 * (512 + 128 + 16)
    assert fm.smem_bytes_estimate(1, 1, 1, 64) - fm.smem_bytes_estimate(1, 1, 1) == ring + 8 * 4 * 32
    assert fm.smem_bytes_estimate(1, 1, 1, 0) == fm.smem_bytes_estimate(1, 1, 1, 64)


def test_split_plan_covers_the_top_k():
    cpu = torch.device("cpu")  # smem class "big", 132 SMs assumed off-GPU
    for T in (1, 32, 128, 600, 4096):
        splits, kps = fm.plan_splits(T, 2048, 1, cpu)
        assert splits * kps >= 2048 and (splits - 1) * kps < 2048 and kps % fm.BLOCK_N == 0
    assert fm.plan_splits(4096, 2048, 1, cpu)[0] == 1  # prefill: enough programs without splitting
    assert fm.programs_per_sm(1, 2, 2, "big") == 4 and fm.programs_per_sm(1, 1, 2, "small") == 3
    assert fm.programs_per_sm(2, 0, 1, "big") == 2  # 4 warps of ~220 registers
    # a register cap: 6 programs of 2 warps at 168 (shared memory allows 7 with one slot), 4 with two slots
    assert fm.programs_per_sm(1, 1, 1, "big", 168) == 6 and fm.programs_per_sm(1, 2, 1, "big", 168) == 4
    # 64-key tiles: still 4 programs of 8 heads (53 KB each) and 2 of 16 on sm_90; 1 of 8 heads with two slots
    assert fm.programs_per_sm(1, 0, 1, "big", 0, 64) == 4 and fm.programs_per_sm(2, 0, 1, "big", 0, 64) == 2
    assert fm.programs_per_sm(1, 2, 1, "small", 0, 64) == 1


def test_tile_rule_takes_64_keys_only_where_a_program_owns_a_token():
    """block_n 0: 64-key tiles at one split (prefill), 32 when the top-k list is split (decode), the splits planned
    as for 32-key tiles; fixed block_n values are kept (two key warps: four take 64 keys always)."""
    cpu = torch.device("cpu")
    assert [fm.tile_keys(0, s) for s in (1, 2, 16)] == [64, 32, 32] and fm.tile_keys(64, 4) == 64
    assert [fm.tile_keys(0, s, 4) for s in (1, 2, 16)] == [64, 64, 64]
    for T in (1, 32, 128, 300, 600, 4096):
        for G in (1, 2):
            s32, k32 = fm.plan_splits(T, 2048, G, cpu, block_n=32, key_warps=2)
            s0, k0 = fm.plan_splits(T, 2048, G, cpu, block_n=0, key_warps=2)
            assert s0 == s32, (T, G)
            assert k0 == (2048 if s32 == 1 else k32) and k0 % fm.tile_keys(0, s0) == 0
    assert fm.plan_splits(4096, 2048, 1, cpu, block_n=0, key_warps=2) == (1, 2048)
    assert fm.plan_splits(128, 2048, 1, cpu, block_n=0, key_warps=2)[0] > 1  # decode B128 splits: 32-key tiles
    assert fm.plan_splits(4096, 2000, 1, cpu, block_n=0, key_warps=2) == (1, 2048)  # whole 64-key tiles
    for bad in (16, 48, 128, -1):
        with pytest.raises(ValueError, match="block_n"):
            fm.check_block_n(bad)


def test_key_warps_rule_four_for_split_lists_at_8_heads_and_whole_lists_at_16():
    """`key_warps_of` / `plan_key_warps` (key_warps 0): four key warps where the top-k list is split at 1-8 heads
    (decode) and where it is not at 9-16 (prefill); their plan: 64-key tiles, two slots, two programs an SM."""
    cpu = torch.device("cpu")  # 132 SMs assumed off-GPU
    assert [fm.key_warps_of(0, 1, 1, s) for s in (True, False)] == [4, 2]
    assert [fm.key_warps_of(0, 2, 1, s) for s in (True, False)] == [2, 4]
    assert fm.key_warps_of(0, 1, 2, True) == 2 and fm.key_warps_of(0, 1, 1, True, 32) == 2  # e4m3 / fixed tiles
    assert fm.key_warps_of(4, 1, 1, False) == 4 and fm.key_warps_of(2, 2, 1, False) == 2  # explicit values kept
    assert fm.ring_slots(0, 1, 4) == fm.ring_slots(0, 2, 4) == 2
    assert fm.num_warps_of(1, 4) == fm.num_warps_of(2, 4) == 4 == fm.num_warps_of(2, 2)
    assert fm.programs_per_sm(1, 0, 1, "big", 0, 64, 4) == 2 and fm.programs_per_sm(2, 0, 1, "big", 0, 64, 4) == 2
    for T, G, want in ((32, 1, 4), (128, 1, 4), (4096, 1, 2), (32, 2, 2), (128, 2, 2), (4096, 2, 4)):
        assert fm.plan_key_warps(T, 2048, G, cpu) == want, (T, G)
    # a split at 8 heads under four key warps' own plan (fewer slots than two key warps': a token count between the
    # two takes two key warps, split)
    assert fm.plan_splits(128, 2048, 1, cpu)[0] == fm.plan_splits(128, 2048, 1, cpu, key_warps=4)[0] > 1
    # four key warps up to 132 tokens at 8 heads (docs/kernels.md v22), then two
    assert fm.plan_key_warps(132, 2048, 1, cpu) == 4 and fm.plan_key_warps(133, 2048, 1, cpu) == 2
    T_mid = 150  # four key warps' plan (264 slots) takes it whole, two key warps' (528) splits it
    assert fm.plan_key_warps(T_mid, 2048, 1, cpu) == 2 and fm.plan_splits(T_mid, 2048, 1, cpu)[0] > 1
    # a captured decode (decode=True) at 1-8 heads also takes four key warps at one split where their 264 slots are
    # at least 0.9 full in one wave or the tokens span at least 1.5 waves; the split plans, 9-16 heads and the
    # eager call (prefill: decode=False) are unchanged
    assert fm.DECODE_K4_FILL == 0.9 and fm.DECODE_K4_WAVES == 1.5
    decode = {T: fm.plan_key_warps(T, 2048, 1, cpu, decode=True)
              for T in (128, 150, 237, 238, 264, 265, 395, 396, 4096)}
    assert decode == {128: 4, 150: 2, 237: 2, 238: 4, 264: 4, 265: 2, 395: 2, 396: 4, 4096: 4}
    assert all(fm.plan_key_warps(T, 2048, 1, cpu) == (4 if T == 128 else 2) for T in decode)
    assert [fm.plan_key_warps(T, 2048, 2, cpu, decode=True) for T in (128, 264, 512)] == [2, 4, 4]
    assert fm.plan_key_warps(512, 2048, 1, cpu, decode=True, q_terms=2, nbuf=1) == 2  # e4m3 build: two always
    # the launch plan takes it (four warps, one split, two slots) and so does plan_splits with the rule's key warps
    plan = fm._launch_plan.__wrapped__
    args = (2048, "cpu", None, 0, 1, 1, 0, 0, 8, 2, 1, None, 2048, None, 0, 0, 3)
    for T, want in ((256, (4, 1, 2)), (512, (4, 1, 2)), (320, (2, 1, 1))):
        s, _, grid, kw, key = plan(T, 8, *args, True)
        assert (kw["WM"], s, kw["NBUF"]) == want and grid == (T, 1), T
    s, _, _, kw, _ = plan(256, 8, *args, False)
    assert (kw["WM"], s) == (2, 2) and plan(256, 8, *args, False)[4] != plan(256, 8, *args, True)[4]
    assert fm.plan_splits(256, 2048, 1, cpu, key_warps=0, decode=True)[0] == 1
    assert fm.plan_splits(256, 2048, 1, cpu, key_warps=0)[0] == 2
    for bad, kw in ((3, {}), (4, {"q_terms": 2, "p_terms": 2}), (4, {"block_n": 32})):
        with pytest.raises(ValueError, match="key_warps"):
            fm.sparse_mla_fp8mma(torch.zeros(2, 8, 576, dtype=torch.bfloat16), torch.zeros(100, 656, dtype=torch.uint8),
                                 torch.zeros(2, 64, dtype=torch.int32), 0.0625, key_warps=bad, **kw)
    # the early refill with four key warps: each value column is read by one warp, so one slot can take it
    assert fm.refill_mode(1, 1, 2, 1, 4) == 1 and fm.refill_mode(1, 1, 2, 1, 2) == 0
    assert fm.refill_mode(1, 0, 1, 1, 4) == 0


def test_dispatch_branches_on_a_gpu_that_runs_it(monkeypatch):
    """The GPU side of the rule with the device faked: the config per shared-memory class and switch, and that
    `mla.dispatched` (what the case matrix and the benchmark record) names what `fp8mma_route` picks."""
    gpu = torch.device("cuda", 0)
    ready = {"value": True}
    monkeypatch.setattr(mla, "_fp8mma_ready", lambda *a: ready["value"])
    monkeypatch.setattr(mla, "num_sms", lambda dev: 132)
    for smem, mode, want in (("big", "", fm.CONFIG_BY_CLASS["big"]), ("big", "0", None),
                             ("small", "", None), ("small", "1", fm.CONFIG_BY_CLASS["small"])):
        monkeypatch.setattr(mla, "smem_class", lambda dev, s=smem: s)
        monkeypatch.setenv("GLM5LIB_FP8MMA", mode)
        assert mla.fp8mma_route(128, 8, "fp8_ds_mla", gpu, torch.bfloat16) == want, (smem, mode)
        assert mla.fp8mma_route(128, 8, "fp8_ds_mla", gpu, torch.float16) is None  # bf16 q only
        assert mla.fp8mma_route(128, 8, "fp8_ds_mla", gpu, torch.bfloat16, aligned=False) is None
        assert mla.fp8mma_route(16, 8, "fp8_ds_mla", gpu, torch.bfloat16) is None  # eager: Triton below 32 tokens
        assert mla.fp8mma_route(16, 8, "fp8_ds_mla", gpu, torch.bfloat16, graph=True) == want  # captured: this one
        assert (mla.dispatched(16, 8, "fp8_ds_mla", gpu, graph=True)[0][0] == "small-fp8mma") == (want is not None)
        assert mla.dispatched(16, 8, "fp8_ds_mla", gpu)[0][0] != "small-fp8mma"
        key, name = mla.dispatched(128, 8, "fp8_ds_mla", gpu)
        assert (key[0] == "small-fp8mma") == (want is not None)
        if want:
            assert key == ("small-fp8mma", "fp8_ds_mla", smem) and name == fm.config_name(want)
        assert (mla.dispatched(128, 16, "fp8_ds_mla", gpu)[0][0] == "small-fp8mma") == (want is not None)
        assert mla.dispatched(128, 17, "fp8_ds_mla", gpu)[0][0] != "small-fp8mma"  # 17+ heads: not this kernel
    ready["value"] = False  # a GPU without the kernel (sm_80, software e4m3, no Gluon)
    monkeypatch.setenv("GLM5LIB_FP8MMA", "1")
    assert mla.fp8mma_route(128, 8, "fp8_ds_mla", gpu, torch.bfloat16) is None


def _sass_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "fp8mma_sass_count.py"
    spec = importlib.util.spec_from_file_location("fp8mma_sass_count", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sass_loop_counter_takes_the_longest_backward_branch():
    sass = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        "        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;",  # the long loop: 0x10 .. 0x50
        "        /*0020*/                   F2FP.F16.E4M3.UNPACK_B R2, R3 ;",
        "        /*0030*/                   HMMA.16816.F32 R4, R8, R12, R4 ;",
        "        /*0040*/               @P0 BRA 0x30 ;",  # a short inner loop
        "        /*0050*/               @P1 BRA 0x10 ;",
        "        /*0060*/                   EXIT ;",
        "        /*0070*/                   BRA 0x70 ;"])  # the trailing self-branch is not a loop
    n, ops = _sass_script().loop_counts(sass)
    assert n == 5 and ops["HMMA"] == 2 and ops["F2FP"] == 1 and ops["BRA"] == 2 and "MOV" not in ops


def test_sass_loop_inner_takes_the_tile_loop_inside_a_loop_over_pieces():
    from glm5lib.kernels.compile_report import sass_loop

    def ins(addr, text):
        return f"        /*{addr:04x}*/                   {text} ;"

    # an outer loop from 0x0 around a 300-instruction tile loop from 0x100 (and a 3-instruction spin loop inside
    # that, too short to count), with spill traffic only in the outer loop
    lines = [ins(0, "LDL R13, [R1+0x4]")] + [ins(16 * i, "HMMA.16816.F32 R4, R8, R12, R4") for i in range(1, 16)]
    tile = [ins(0x100 + 16 * i, "F2FP.F16.E4M3.UNPACK_B R2, R3") for i in range(299)]
    tile[150] = ins(0x100 + 16 * 150, "@P2 BRA 0x%x" % (0x100 + 16 * 148))
    end = 0x100 + 16 * 299
    lines += tile + [ins(end, "@P0 BRA 0x100"), ins(end + 16, "STL [R1+0x4], R8"), ins(end + 32, "@P1 BRA 0x0"),
                     ins(end + 48, "EXIT")]
    sass = "\n".join(lines)
    n_outer, _, h_outer = sass_loop(sass, nops=True)
    n_inner, _, h_inner = sass_loop(sass, nops=True, inner=True)
    assert n_outer == len(lines) - 1 and h_outer["LDL"] == h_outer["STL"] == 1
    assert n_inner == 300 and "LDL" not in h_inner and "STL" not in h_inner and h_inner["F2FP"] == 298
    single = "\n".join(tile + [ins(end, "@P0 BRA 0x100")])  # one loop: inner or not, the same
    assert sass_loop(single, inner=True) == sass_loop(single)
    # every loop in address order of its branch (`sass_loops`, the top-k select's per-pass counts): the spin loop,
    # the tile loop, the outer loop
    from glm5lib.kernels.compile_report import sass_loops

    loops = sass_loops(sass, nops=True)
    assert [n for n, _ in loops] == [3, 300, len(lines) - 1]
    assert loops[1][1]["F2FP"] == 298 and loops[2][1]["LDL"] == loops[2][1]["STL"] == 1


def test_ablation_pads_hold_the_whole_kernels_programs_per_sm():
    """`ablate_launch`'s parts run at the whole kernel's programs per SM: the shared-memory pad (a power of two) brings
    a program of the part's own bytes to that count in both classes, and a count no pad can reach is an error."""
    for smem in ("big", "small"):
        for G in (1, 2):
            for cfg in fm.CONFIG_BY_CLASS.values():
                for bn in fm.BLOCK_NS:
                    per_sm = fm.programs_per_sm(G, cfg.nbuf, cfg.q_terms, smem, cfg.maxnreg, bn)
                    for own in (fm.smem_bytes_estimate(G, cfg.nbuf, cfg.q_terms, bn),
                                fm.ring_slots(cfg.nbuf, G) * bn * 656):
                        if fm.SMEM_PER_SM[smem] // (own + 2048) < per_sm:
                            continue  # the part alone already holds fewer programs than the kernel
                        w = fm.pad_words(own, per_sm, smem)
                        assert w & (w - 1) == 0
                        assert fm.SMEM_PER_SM[smem] // (own + 4 * w + 2048) == per_sm, (smem, G, cfg, bn, own)
    with pytest.raises(ValueError, match="programs per SM"):
        fm.pad_words(200 * 1024, 2)
    q = torch.zeros(4, 8, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="part must be one of"):
        fm.ablate_launch(q, torch.zeros(64, 656, dtype=torch.uint8), torch.zeros(4, 64, dtype=torch.int32), 0.1,
                         "gathers-only")
    with pytest.raises(ValueError, match="row_threads"):
        fm.sparse_mla_fp8mma(q, torch.zeros(64, 656, dtype=torch.uint8), torch.zeros(4, 64, dtype=torch.int32), 0.1,
                             row_threads=3)


_PARTS_SCRIPT = """
import json
from glm5lib.kernels import mla_gluon_fp8mma as m
for G in (1, 2):
    for part in ("gathers", "compute"):
        k = m.aot_compile_part(90, part, G, m.CONFIG_BY_CLASS["big"])
        print(json.dumps({"G": G, "part": part, "shared": int(k.metadata.shared)}), flush=True)
"""


def test_ablation_builds_compile_at_the_kernels_programs_per_sm():
    """The measurement builds `ablate_launch` launches (gathers alone, compute alone) compile for sm_90 (child
    process, interpreter off), each with the shared memory that holds it at the shipped kernel's programs per SM;
    fewer threads a row than one a warp are refused (a tile's rows would be copied twice, by different warps)."""
    cfg = fm.CONFIG_BY_CLASS["big"]
    rows = compile_rows(_PARTS_SCRIPT, timeout=600)
    assert sorted((r["G"], r["part"]) for r in rows) == [(G, p) for G in (1, 2) for p in ("compute", "gathers")]
    for r in rows:
        # the split build `aot_compile_part` makes: the key warps the rule takes there (four at 1-8 heads) and its tile
        wm = fm.key_warps_of(cfg.key_warps, r["G"], cfg.q_terms, True, cfg.block_n)
        want = fm.programs_per_sm(r["G"], cfg.nbuf, cfg.q_terms, "big", cfg.maxnreg, fm.tile_keys(cfg.block_n, 2, wm),
                                  wm)
        assert fm.SMEM_PER_SM["big"] // (r["shared"] + 1024) == want, r
    with pytest.raises(ValueError, match="row_threads"):
        fm.aot_compile(90, 2, row_threads=2)


@pytest.mark.parametrize("T,tiles,P", [(529, 32, 528), (4096, 32, 528), (700, 16, 528), (5, 3, 4), (97, 7, 13)])
def test_balanced_schedule_covers_every_tile_once_and_cuts_a_token_at_most_once(T, tiles, P):
    runs = fm.balanced_pieces(T, tiles, P)
    seen = {}
    for p, pieces in enumerate(runs):
        for t, a, b, kind in pieces:
            assert 0 <= a < b <= tiles
            seen.setdefault(t, []).append((a, b, kind, p))
        # a run is contiguous in token-major order, and only its first piece can be a tail, its last a head
        assert all(k == "whole" for _, _, _, k in pieces[1:-1])
        assert len(pieces) < 2 or (pieces[0][3] != "head" and pieces[-1][3] != "tail")
    assert sorted(seen) == list(range(T))
    lengths = [sum(b - a for _, a, b, _ in pieces) for pieces in runs]
    assert sum(lengths) == T * tiles and max(lengths) - min(lengths) <= 1  # balanced to a tile
    cut = []
    for t, ps in seen.items():
        if len(ps) == 1:
            assert ps[0][:3] == (0, tiles, "whole")
        else:  # a head in program p and a tail in p + 1 that meet
            (a0, b0, k0, p0), (a1, b1, k1, p1) = ps
            assert len(ps) == 2 and (a0, k0, k1, b1) == (0, "head", "tail", tiles) and b0 == a1 and p1 == p0 + 1
            cut.append((p0, t))
    # the merge kernel's rule for boundary b's token: ((b + 1) n / P) // tiles, where that run end is inside a token
    n = T * tiles
    rule = [(b, (b + 1) * n // P // tiles) for b in range(P - 1) if (b + 1) * n // P % tiles]
    assert sorted(cut) == rule


def test_balanced_schedule_rule(monkeypatch):
    assert fm.balanced_mode(1, 1, 1, 529, 528) and not fm.balanced_mode(1, 1, 1, 528, 528)
    assert not fm.balanced_mode(0, 1, 1, 4096, 528) and not fm.balanced_mode(1, 0, 1, 4096, 528)
    assert not fm.balanced_mode(1, 1, 2, 4096, 528)
    with pytest.raises(ValueError, match="sched must be one of"):
        fm.check_sched(2)
    q = torch.zeros(40, 8, 576, dtype=torch.bfloat16)
    cache = torch.zeros(100, 656, dtype=torch.uint8)
    idx = torch.zeros(40, 512, dtype=torch.int32)
    with pytest.raises(ValueError, match="must be in 2..40"):
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, programs=41)
    with pytest.raises(ValueError, match="applies only where the balanced schedule does"):  # split: not balanced
        fm.sparse_mla_fp8mma(q, cache, idx, 0.0625, programs=16, num_splits=2)
    assert fm.config_name((0, 1, 1, 0, 0, 8, 2, 1)) == "fp8mma-nbufG-f16-nplan-t8-eplan-b"
    # the launch plan off-GPU (132 SMs and the big class assumed): 4 programs of 8 heads an SM, so 528 slots
    plan = fm._launch_plan.__wrapped__
    args = ("cpu", None, 0, 1, 1, 0, 0, 8, 2)
    s, _, grid, kw, _ = plan(4096, 8, 2048, *args, 1, None, 2048)
    assert (s, grid, kw["BALANCED"], kw["REFILL"], kw["BN"]) == (1, (528,), True, 1, 64)
    s, _, grid, kw, _ = plan(4096, 8, 2048, *args, 0, None, 2048)
    assert (grid, kw["BALANCED"]) == ((4096, 1), False)
    s, _, grid, kw, _ = plan(128, 8, 2048, *args, 1, None, 2048)  # decode: split, 32-key tiles refilled whole
    assert s > 1 and grid == (128, s) and not kw["BALANCED"]
    s, _, grid, kw, _ = plan(4096, 16, 2048, *args, 1, None, 2048)  # 16 heads: two slots, refilled whole
    assert grid == (4096, 1) and not kw["BALANCED"]
    # index rows the kernel cannot read as one list: strided (a view), or top-k not a whole number of tiles
    assert plan(4096, 8, 2048, *args, 1, None, 4096)[2] == (4096, 1)
    assert plan(4096, 8, 2000, *args, 1, None, 2000)[2] == (4096, 1)
    # the measurement knob: that many programs wherever T >= programs
    assert plan(40, 8, 512, *args, 1, 1, 512, 16)[2:4:2] == ((16,),) and plan(40, 8, 512, *args, 1, 1, 512, 16)[3][
        "BALANCED"]
    assert plan(40, 8, 512, *args, 1, 1, 512, 41)[2] == (40, 1)


def _attend(logits, values):
    """fp64 softmax attention over a key subset: (normalised output [H, D], log2 lse [H]); -inf / zeros for none."""
    lse = torch.logsumexp(logits, dim=1)
    o = torch.where(torch.isinf(lse)[:, None], 0.0, torch.softmax(logits, dim=1).nan_to_num() @ values)
    return o, lse / torch.log(torch.tensor(2.0, dtype=torch.float64))


@pytest.mark.parametrize("T,tiles,P,H", [(11, 4, 5, 8), (9, 3, 8, 5)])
def test_merge_pieces_gives_the_cut_tokens_their_attention_over_all_keys(T, tiles, P, H):
    """The merge of the balanced schedule's two partials (Triton interpreter), on pieces laid out as the kernel
    writes them (`balanced_pieces`), against attention over each token's whole key list; tokens done whole are left
    alone. One cut token has a piece without any valid key, one token has none at all."""
    BN, D = 2, 512
    gen = torch.Generator().manual_seed(T)
    logits = torch.randn(T, H, tiles * BN, generator=gen, dtype=torch.float64)
    values = torch.randn(T, tiles * BN, D, generator=gen, dtype=torch.float64)
    runs = fm.balanced_pieces(T, tiles, P)
    cut = [t for ps in runs for t, a, b, k in ps if k == "head"]
    logits[cut[0], :, : BN] = float("-inf")  # the head piece of the first cut token: no valid key (if one tile)
    logits[cut[-1]] = float("-inf")  # the last cut token: no valid key in either piece (zeros, lse -inf)
    from glm5lib.kernels.mla_gluon import split_buffer

    part = split_buffer(2, P, H, torch.empty(0)).fill_(float("nan"))
    o_part = part[: 2 * P * H * D].view(2, P, H, D)
    l_part = part[2 * P * H * D:].view(2, P, H)
    for p, ps in enumerate(runs):
        for t, a, b, kind in ps:
            if kind == "whole":
                continue
            o, l2 = _attend(logits[t, :, a * BN: b * BN], values[t, a * BN: b * BN])
            slot, bnd = (0, p) if kind == "head" else (1, p - 1)
            o_part[slot, bnd], l_part[slot, bnd] = o.float(), l2.float()
    out = torch.full((T, H, D), 7.0, dtype=torch.bfloat16)
    lse = torch.full((T, H), 7.0)
    fm.merge_pieces(part, out, lse, tiles, P)
    for t in range(T):
        if t in cut:
            o, l2 = _attend(logits[t], values[t])
            torch.testing.assert_close(out[t].double(), o, atol=2e-2, rtol=1e-2)
            torch.testing.assert_close(lse[t].double(), l2 * torch.log(torch.tensor(2.0, dtype=torch.float64)),
                                       atol=1e-5, rtol=1e-5)
        else:
            assert (out[t] == 7.0).all() and (lse[t] == 7.0).all()
    assert len(cut) >= 2, "the case must cut at least two tokens"
    assert (out[cut[-1]] == 0).all() and torch.isinf(lse[cut[-1]]).all()


def _run_ptx(ptx: str, word: int) -> tuple[int, int]:
    """($0, $1) of `ptx` for $2 = word: an emulator of the five b32 instructions `E4M3_F16_INT_PTX` uses (mov, prmt
    in its default mode, shr, and, or), so that the test runs the kernel's own text."""
    regs, mask = {"$2": word}, 0xFFFFFFFF

    def val(tok):
        return int(tok, 0) if tok[0].isdigit() else regs[tok]

    body = ptx.strip().removeprefix("{").removesuffix("}")
    for line in body.split(";"):
        parts = line.replace(",", " ").split()
        if not parts or parts[0] == ".reg":
            continue
        op, dst, *src = parts
        a = [val(x) for x in src]
        if op == "mov.b32":
            regs[dst] = a[0]
        elif op == "prmt.b32":  # d.byte[i] = {b, a}.byte[selector nibble i] (the msb of a nibble: sign mode, unused)
            src8 = a[0] | (a[1] << 32)
            assert all(((a[2] >> (4 * i)) & 0x8) == 0 for i in range(4))
            regs[dst] = sum(((src8 >> (8 * ((a[2] >> (4 * i)) & 0x7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "shr.b32":
            regs[dst] = (a[0] & mask) >> a[1]
        elif op == "and.b32":
            regs[dst] = a[0] & a[1] & mask
        elif op == "or.b32":
            regs[dst] = (a[0] | a[1]) & mask
        else:
            raise AssertionError(f"unexpected instruction {op}")
    return regs["$0"], regs["$1"]


def test_integer_widening_is_exact_for_every_e4m3_byte():
    # every finite e4m3 byte (0x7F / 0xFF are NaN) in each of the word's four positions, beside three others: the
    # fp16 the PTX makes is 2^-8 times torch's widening of the same byte, bit for bit, and lands in the register
    # half `cvt.rn.f16x2.e4m3x2` would put it in ($0: bytes 0 (low half), 1; $1: bytes 2, 3)
    finite = [b for b in range(256) if b & 0x7F != 0x7F]
    ref = (torch.tensor(finite, dtype=torch.uint8).view(torch.float8_e4m3fn).float() * 2.0 ** -8).half()
    want = dict(zip(finite, ref.view(torch.int16).tolist()))
    fillers = (0x00, 0x80, 0x7E, 0xFE, 0x01, 0x38)
    for i, b in enumerate(finite):
        for pos in range(4):
            others = [fillers[(i + j) % len(fillers)] for j in range(4)]
            others[pos] = b
            word = sum(x << (8 * j) for j, x in enumerate(others))
            lo, hi = _run_ptx(fm.E4M3_F16_INT_PTX, word)
            halves = [lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16]
            assert [h - 0x10000 if h & 0x8000 else h for h in halves] == [want[x] for x in others], (hex(word), pos)


def test_widen_is_refused_outside_the_fp16_build():
    fm.check_widen(4, 1, 1)
    with pytest.raises(ValueError, match="widen must be one of"):
        fm.check_widen(5, 1, 1)
    with pytest.raises(ValueError, match="fp16-product build"):
        fm.check_widen(1, 2, 2)
    assert fm.config_name(fm.DEFAULT._replace(widen=2)).endswith("-i2-wgplan")
    assert fm.config_name(fm.DEFAULT) == fm.config_name(fm.DEFAULT._replace(widen=0))


_WIDEN_SCRIPT = """
import json
from glm5lib.kernels import mla_gluon_fp8mma as m
from glm5lib.kernels.compile_report import cuobjdump, sass_loop
for arch in (90, 120):
    for widen in (0, 2, 4):
        cfg = m.CONFIG_BY_CLASS["big"]._replace(widen=widen)
        k = m.aot_compile(arch, 1, **m.config_kwargs(cfg), split=True)
        hist = sass_loop(cuobjdump(k.asm["cubin"], "-sass"), nops=True)[2]
        print(json.dumps({"arch": arch, "widen": widen, "f2f": sum(v for op, v in hist.items() if op.startswith("F2F")),
                          "prmt": hist.get("PRMT", 0), "hmma": hist.get("HMMA", 0)}), flush=True)
"""


def test_integer_widening_builds_compile_and_take_conversions_off_the_hardware_path():
    # the shipped decode build with 0, 2 and 4 latent chunks widened by `_e4m3_f16_int`, compiled for sm_90 and
    # sm_120 (child process, interpreter off; the operand loads are `assert_trivial`, so each build also proves the
    # integer route leaves every byte in its thread): the same products, and each chunk moved off `cvt` takes its
    # share of the F2F conversions with it (the rope's bf16 operands are not widened by either)
    rows = {(r["arch"], r["widen"]): r for r in compile_rows(_WIDEN_SCRIPT, timeout=600)}
    for arch in (90, 120):
        base, half, whole = (rows[arch, w] for w in (0, 2, 4))
        assert base["hmma"] == half["hmma"] == whole["hmma"] > 0
        per_chunk = (base["f2f"] - whole["f2f"]) / 4
        assert per_chunk > 0 and half["f2f"] == base["f2f"] - 2 * per_chunk
        assert whole["prmt"] > half["prmt"] > base["prmt"]


def test_wgmma_is_refused_outside_four_key_warps_on_sm90():
    fm.check_wgmma(1, 4, 90)
    fm.check_wgmma(0, 2, 120)
    with pytest.raises(ValueError, match="wgmma must be one of"):
        fm.check_wgmma(4, 4)
    with pytest.raises(ValueError, match="four key warps"):
        fm.check_wgmma(1, 0)  # the rule may take two key warps
    with pytest.raises(ValueError, match="sm_120"):
        fm.check_wgmma(1, 4, 120)
    with pytest.raises(ValueError, match="sm_89"):
        fm.aot_compile(89, 1, **fm.config_kwargs(fm.DEFAULT._replace(key_warps=4, wgmma=1)))
    assert fm.config_name(fm.DEFAULT._replace(key_warps=4, wgmma=1)).endswith("-k4-wg")
    assert fm.config_name(fm.DEFAULT._replace(key_warps=4, wgmma=2)).endswith("-k4-wga")
    assert fm.config_name(fm.DEFAULT._replace(wgmma=0)).endswith("-kplan")
    # the rule (3): the in-flight build where four key warps hold 9-16 heads on sm_90, nowhere else
    assert [fm.wgmma_of(3, wm, G, arch) for wm, G, arch in ((4, 2, 90), (4, 1, 90), (2, 2, 90), (4, 2, 120),
                                                             (4, 2, 100))] == [2, 0, 0, 0, 0]
    assert fm.wgmma_of(1, 4, 1, 90) == 1 and fm.wgmma_of(0, 4, 2, 90) == 0
    fm.check_wgmma(3, 0, 120)  # the rule is no refusal: it resolves to 0 off sm_90
    with pytest.raises(ValueError, match="without CUDA"):  # a forced build on the CPU, before any launch
        fm.sparse_mla_fp8mma(torch.zeros(2, 8, 576, dtype=torch.bfloat16), torch.zeros(100, 656, dtype=torch.uint8),
                             torch.zeros(2, 64, dtype=torch.int32), 0.1, key_warps=4, wgmma=2)


_WGMMA_SCRIPT = """
import json
from glm5lib.kernels import mla_gluon_fp8mma as m
from glm5lib.kernels.compile_report import cuobjdump, sass_loop, sass_loop_body, smem_bytes
for gs, wgs in ((1, (0, 1, 2)), (0, (0, 1))):  # the row scales' copy mode: the shipped one, then the other
    m.GATHER_SCALES = gs
    for G, split in ((1, True), (2, False)):
        for wg in wgs:
            cfg = m.CONFIG_BY_CLASS["big"]._replace(key_warps=4, wgmma=wg)
            k = m.aot_compile(90, G, **m.config_kwargs(cfg), split=split)
            sass = cuobjdump(k.asm["cubin"], "-sass")
            hist = sass_loop(sass, nops=True)[2]
            sm = smem_bytes(sass_loop_body(sass, True)[0])
            stats = m.compile_stats(90, G, **m.config_kwargs(cfg), split=split)
            print(json.dumps({"gs": gs, "G": G, "wg": wg, "hmma": hist.get("HMMA", 0), "hgmma": hist.get("HGMMA", 0),
                              "stack": stats["stack"], "local": stats["local"],
                              "f2f": sum(v for op, v in hist.items() if op.startswith("F2F")), "read": sm["read"],
                              "written": sm["written"], "ldsm": sm["by_op"].get("LDSM.16.M88.4", 0),
                              "shared": k.metadata.shared, "depbar1": sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1")}),
                  flush=True)
m.GATHER_SCALES = 1
# the in-flight build over a one-slot ring refilled early, one a token and balanced (the loop's refill reads the next
# tile's key ids after S)
for G in (1, 2):
    for sched in (0, 1):
        cfg = m.Config(1, 1, 1, 0, 0, 8, 1, sched, 4, 0, 2)
        r = m.compile_stats(90, G, **m.config_kwargs(cfg), split=False)
        k = m.aot_compile(90, G, **m.config_kwargs(cfg), split=False)
        print(json.dumps({"early": True, "G": G, "sched": sched, "stack": r["stack"], "local": r["local"],
                          "hgmma": cuobjdump(k.asm["cubin"], "-sass").count("HGMMA")}), flush=True)
# the shipped config (the rule, 3) on sm_90 / sm_120 at 8 and 16 heads, split and not
for arch in (90, 120):
    for G in (1, 2):
        for split in (True, False):
            k = m.aot_compile(arch, G, **m.config_kwargs(m.CONFIG_BY_CLASS["big"]), split=split)
            print(json.dumps({"shipped": True, "arch": arch, "G": G, "split": split,
                              "hgmma": cuobjdump(k.asm["cubin"], "-sass").count("HGMMA")}), flush=True)
"""


def test_wgmma_builds_read_q_once_a_warpgroup():
    # four key warps (one warpgroup) at 8 heads split (decode) and 16 heads whole (prefill), S by mma_v2 and by wgmma,
    # compiled for sm_90 (child process, interpreter off; K's operand and S's accumulator conversions between the
    # two products' layouts are `assert_trivial`, so each build also proves they move no element across threads).
    # S^T's k16 steps (4 chunks of 128 columns and the 64 rope columns: 36) move from HMMA (one per 16 keys, n8 tile
    # and k16 step in each warp) to HGMMA (one m64nHNk16 per step for the warpgroup), and each warp stops loading
    # q's fragments: its shared-memory reads a tile fall by q's bytes, 576 columns x 2 bytes a head, exactly
    # (wgmma 2, each chunk's product in flight while the next one's K is widened, issues the same instructions: it
    # waits for one group fewer at each chunk, `WARPGROUP.DEPBAR.LE gsb0, 0x1`); with the row scales read in each
    # product's layout (`GATHER_SCALES` 1) their reads may differ too
    out = compile_rows(_WGMMA_SCRIPT, timeout=900)
    rows = {(r["G"], r["wg"]): r for r in out if "wg" in r and r["gs"] == 1}
    mode0 = {(r["G"], r["wg"]): r for r in out if "wg" in r and r["gs"] == 0}
    assert fm.GATHER_SCALES == 1 and len(rows) == 6 and len(mode0) == 4
    # the shipped rule takes it only in sm_90's one-split 16-head build (four key warps: the prefill)
    assert {(r["arch"], r["G"], r["split"]) for r in out if r.get("shipped") and r["hgmma"]} == {(90, 2, False)}
    assert sum(bool(r.get("shipped")) for r in out) == 8
    for G in (1, 2):
        base = rows[G, 0]
        for wg in (rows[G, 1], rows[G, 2]):
            assert base["hgmma"] == 0 and wg["hgmma"] == 36
            assert base["hmma"] - wg["hmma"] == 36 * G
            assert base["ldsm"] - wg["ldsm"] == 576 * 2 * 8 * G
            # everything else a tile reads from shared memory is the same, but for the scales under `GATHER_SCALES`
            # 1: read as a [BN, 1] column in the products' layout (`_scale`), which differs between mma_v2's S and
            # wgmma's (this Triton, 3.9: 256 bytes fewer a tile in the wgmma build, as wider loads); in mode 0, [chunk,
            # key] scales read alike, the difference is q's bytes alone
            other = (base["read"] - base["ldsm"]) - (wg["read"] - wg["ldsm"])
            assert other == 256
            assert wg["f2f"] == base["f2f"] and wg["written"] == base["written"] and wg["shared"] == base["shared"]
        assert mode0[G, 0]["ldsm"] - mode0[G, 1]["ldsm"] == 576 * 2 * 8 * G == mode0[G, 0]["read"] - mode0[G, 1]["read"]
        assert rows[G, 1]["depbar1"] == 0 and rows[G, 2]["depbar1"] == 3  # chunks 0-2 waited for one behind
        assert all(rows[G, w]["stack"] == rows[G, w]["local"] == 0 for w in (0, 1, 2))  # no spills (255 registers)
    early = [r for r in out if r.get("early")]
    assert len(early) == 4 and all(r["hgmma"] == 36 for r in early)


def test_smem_bytes_counts_a_warps_shared_memory_traffic_by_width():
    from glm5lib.kernels.compile_report import sass_loop_body, smem_bytes

    texts = ["LDS.128 R4, [R2]", "@P0 LDS.64 R4, [R2+0x10]", "LDS R5, [R2]", "LDS.U8 R1, [R2]",
             "LDSM.16.M88.4 R72, [R172+UR6+0x8000]", "LDSM.16.MT88.2 R8, [R3]",
             "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", "@!P1 LDGSTS.E [R1+0x4], desc[UR4][R6.64]",
             "STS.64 [R1], R2", "STS [R1], R2", "F2FP.F16.E4M3.UNPACK_B R2, R3", "HMMA.16816.F32 R4, R8, R12, R4"]
    assert smem_bytes(["ATOMS.ADD R1, [R2], R3", "STSM.16.M88.2 [R1], R2"]) == {
        "read": 0, "written": 256, "by_op": {"STSM.16.M88.2": 256}, "uncounted": {"ATOMS": 1}}
    sm = smem_bytes(texts)
    assert sm["read"] == 32 * (16 + 8 + 4 + 1) + 128 * (4 + 2)
    assert sm["written"] == 32 * (16 + 4 + 8 + 4)
    assert sm["by_op"]["LDSM.16.M88.4"] == 512 and sm["by_op"]["LDGSTS.E"] == 128
    assert "HMMA.16816.F32" not in sm["by_op"] and sm["uncounted"] == {}
    sass = "\n".join(f"        /*{16 * i:04x}*/                   {t} ;"
                     for i, t in enumerate(texts + ["@P0 BRA 0x20"]))
    body, n_all = sass_loop_body(sass)
    assert n_all == len(texts) + 1 and body[0] == texts[2] and len(body) == len(texts) - 1
