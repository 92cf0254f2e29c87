"""Which sparse-MLA configs each committed piece of H200 evidence exercised, against the configs shipped now.

The H200 files were produced at different commits: the v5 decode verification at febd9ab; the matrix and compute-
sanitizer with the sm_89/sm_120 ("small" shared-memory class) configs forced on the H200 at 4bea5da; the full case
matrix, compute-sanitizer and the benchmark at 6eaff6f (below; the benchmark records its commit in the JSON); the
vLLM call-path harness at 836d561 (the Triton kernel; the run with the fp8-cache kernel at 33e8f55 is
`sweeps/vllm_harness_h200_33e8f55.json`). The configs of a commit are its `CONFIGS` (`git show REV:src/glm5lib/kernels/mla.py`); a case's config
follows from its shape by `config_key` on the H200 (132 SMs) in the class the run used ("big" unless forced), or is
a Gluon kernel's ("large-gluon", "small-fp8mma" keys) where the dispatch rules (`mla.gluon_large_shape`,
`mla.fp8mma_shape`) send the shape there.

Files written since the case matrix records each case's config (`checks` adds `config` to a JSON row and
`config=NAME` to a log line) name what ran; for older files the names are inferred from the shapes with today's
`CONFIGS` ("recorded": False) and such a piece does not count as having run a shipped config: a config changed
after the run would otherwise be credited with it.

The full case matrix, compute-sanitizer and the benchmark ran again on the H200 at 6eaff6f (round 26), each case
naming its config: the matrix reached every sm_90 config shipped now but one (the Triton prefill config that 9-16
heads over fp8_ds_mla fall back to with GLM5LIB_FP8MMA=0, last run at 73d2a37, below), compute-sanitizer those its
invalid-index cases reach; among them the Gluon kernels for 17-128 heads (the dequantising-producer kernel over
fp8_ds_mla, "gluon-BN64-nbuf2-dq", with its tail plan and balanced schedule; the ping-pong kernel over bf16 rows) and
the fp8-cache kernel for 1-16 heads with its key-warps and wgmma rules. Rounds 19-25 had no H200 and ran the same
pieces on an H100 (the same sm_90 cubins: Triton 3.6 compiles for the architecture, not the card); the last of them,
round 24's matrix and memcheck at a815ef4, are kept as "h100_full_matrix" and "h100_sanitizer", and "h100_bench" is
`bench all --quick` on an H100 at 18bdc50 (its targets are the H100's, not the issue's H200 ones). The earlier H200
runs are under `outputs/bench/sweeps/` with their commit in the name (97dc8b8: round 17's). The fp8-cache kernel's 99
KB build (sm_89 / sm_120 with GLM5LIB_FP8MMA=1; round 26's fp16-product one) ran the matrix and memcheck on an H100
with that class forced ("h100_*_smem_small_fp8mma").

Round 31 changed the fp8-cache kernel's 1-8-head prefill build under the same config name: its early refill copies
whole 128-byte row pieces and a row's scales at once (`mla_gluon_fp8mma.REFILL_ROWS`, v41-v42). The H200 pieces ran
the code before it; "h100_full_matrix_r31" (the matrix at fc1f348 on an H100) ran the new one, and its sanitizer runs
(racecheck, memcheck, synccheck of `scripts/fp8mma_sanitize_case.py`'s cases) are
`outputs/bench/sweeps/*_refill_rows{1,2}_h100_071443f.log`.

`coverage(root)` reads the files and reports, per piece: cases, passes, and the config names it ran; and per
shipped config of both classes: which pieces ran that exact config. The notebook prints it instead of prose.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from glm5lib.kernels.mla import CONFIGS, config_key, fp8mma_name, fp8mma_shape, gluon_large_name, gluon_large_shape
from glm5lib.kernels.mla_gluon_fp8mma import CONFIG_BY_CLASS as FP8MMA_CONFIGS
from glm5lib.paths import repo_root

H200_SMS = 132
SMEM = "big"  # sm_90

FULL_MATRIX = "outputs/bench/checks_h200_full.json"
FULL_MATRIX_SMALL = "outputs/bench/checks_h200_full_small.json"
SANITIZER = "outputs/bench/sanitizer_h200.log"
SANITIZER_SMALL = "outputs/bench/sanitizer_h200_small.log"
VERIFY_V5 = "outputs/bench/sweeps/verify_v5_decode.log"
BENCH = "outputs/bench/bench_h200.json"
HARNESS = "outputs/bench/vllm_harness_h200.json"
# round 8's matrix and sanitizer (the fp8-cache kernel then took 1-8 heads): the last H200 runs of the Triton configs
# that 9-16 heads over fp8_ds_mla fall back to on sm_90 (GLM5LIB_FP8MMA=0, fp16 q, no Gluon); those configs and the
# Triton kernel are unchanged since
FULL_MATRIX_R8 = "outputs/bench/sweeps/checks_h200_full_73d2a37.json"
SANITIZER_R8 = "outputs/bench/sweeps/sanitizer_h200_73d2a37.log"
R8_COMMIT, R8_FP8MMA_MAX_H = "73d2a37", 8
RUN_COMMIT = "6eaff6f"  # the case matrix (each case records its config), with the Gluon kernels dispatched
SMALL_COMMIT = "4bea5da"  # the matrix and compute-sanitizer with the sm_89/sm_120 configs forced
FULL_MATRIX_H100 = "outputs/bench/sweeps/checks_h100_full_a815ef4.json"
SANITIZER_H100 = "outputs/bench/sweeps/sanitizer_h100_a815ef4.log"
# the matrix and memcheck with the 99 KB class forced and GLM5LIB_FP8MMA=1: the fp8-cache kernel's 99 KB build (round
# 26's fp16-product one), on an H100 (sm_90: the class's plans, this GPU's occupancy)
FULL_MATRIX_SMALL_FP8MMA = "outputs/bench/sweeps/checks_h100_full_small_fp8mma_89cb5a4.json"
SANITIZER_SMALL_FP8MMA = "outputs/bench/sweeps/sanitizer_h100_small_fp8mma_89cb5a4.log"
SMALL_FP8MMA_COMMIT = "89cb5a4"
BENCH_H100 = "outputs/bench/sweeps/bench_h100_18bdc50.json"
FULL_MATRIX_H100_R31 = "outputs/bench/sweeps/checks_h100_full_fc1f348.json"  # after v41-v42 (REFILL_ROWS 2)
R31_COMMIT = "fc1f348"
H100_COMMIT = "a815ef4"  # the matrix of round 24's shipped configs and plans on an H100 (sm_90)
H100_SANITIZER_COMMIT = "a815ef4"  # its compute-sanitizer memcheck (the same configs)
SANITIZER_COMMIT = "6eaff6f"  # compute-sanitizer (the sm_89/sm_120 class forced: SMALL_COMMIT)
HARNESS_COMMIT = "836d561"  # the harness (files written since record their own)

_CASE = re.compile(r"^(?P<group>[\w-]+):T(?P<T>\d+)-H(?P<H>\d+)-K\d+-N\d+-(?P<fmt>bf16|fp8_ds_mla)-")


def _key(name: str, smem: str = SMEM, fp8mma_max_h: int | None = None) -> tuple[str, str, str] | None:
    """The config key a sparse-MLA case name runs under on the H200 today (None for indexer cases): a `CONFIGS` key,
    or ("large-gluon", format, "big") / ("small-fp8mma", "fp8_ds_mla", "big") where `sparse_mla` takes a Gluon kernel
    on sm_90 (`mla.gluon_large_shape`, `mla.fp8mma_shape`: the rules themselves, whatever the environment switches say
    in this process). fp8mma_max_h: the fp8-cache kernel's head limit of an older run (8 before round 9)."""
    m = _CASE.match(name)
    return None if m is None else _shape_key(int(m["T"]), int(m["H"]), m["fmt"], smem, fp8mma_max_h)


def _shape_key(T: int, H: int, fmt: str, smem: str = SMEM, fp8mma_max_h: int | None = None) -> tuple[str, str, str]:
    """The config key `sparse_mla` runs a shape under on the H200 today, by the dispatch rules alone (with an older
    run's head limit for the fp8-cache kernel when given)."""
    if smem == SMEM and fp8mma_shape(T, H, fmt) and (fp8mma_max_h is None or H <= fp8mma_max_h):
        return ("small-fp8mma", fmt, smem)
    if gluon_large_shape(T, H, fmt, smem):
        return ("large-gluon", fmt, smem)
    return config_key(T, H, fmt, smem, H200_SMS)


def shipped_configs() -> dict[str, str]:
    """{key: config name} of everything `sparse_mla` dispatches to on the H200 and on sm_89 / sm_120 (there the
    fp8-cache kernel's 99 KB build with GLM5LIB_FP8MMA=1)."""
    out = {"/".join(k): cfg.name for k, cfg in CONFIGS.items()}
    for fmt in ("bf16", "fp8_ds_mla"):
        out[f"large-gluon/{fmt}/{SMEM}"] = gluon_large_name(fmt)
    for smem in (SMEM, "small"):
        out[f"small-fp8mma/fp8_ds_mla/{smem}"] = fp8mma_name(FP8MMA_CONFIGS[smem])
    return out


def _names(keys, table: dict) -> dict[str, str]:
    shipped = shipped_configs()
    return {"/".join(k): table[k].name if k in table else shipped["/".join(k)] for k in sorted(set(keys))}


def _ran_key(name: str, config: str, smem: str = SMEM) -> tuple[str, str, str] | None:
    """The config key of a case by the config its run recorded (None for indexer cases): a Gluon kernel's by its
    name's prefix, else the Triton kernel's `CONFIGS` key for the shape. The dispatch rules move between rounds
    (round 22 took 17-128 heads below 128 tokens to the Gluon kernels), so a run is read by what it ran."""
    m = _CASE.match(name)
    if m is None:
        return None
    if config.startswith("gluon-"):
        return ("large-gluon", m["fmt"], smem)
    if config.startswith("fp8mma-"):
        return ("small-fp8mma", m["fmt"], smem)
    return config_key(int(m["T"]), int(m["H"]), m["fmt"], smem, H200_SMS)


def _configs(named: list[tuple[str, str | None]], smem: str, fp8mma_max_h: int | None = None
             ) -> tuple[dict[str, str], bool]:
    """({config key: config name}, recorded) from (case name, recorded config or None) pairs: the names the run
    recorded when every sparse-MLA case has one (each keyed by what it ran, `_ran_key`), else the shapes' configs in
    today's `CONFIGS`."""
    keyed = [(k, c) for k, c in ((_key(n, smem, fp8mma_max_h), c) for n, c in named) if k]
    if keyed and all(c for _, c in keyed):
        ran: dict[str, set] = {}
        for n, c in named:
            k = _ran_key(n, c, smem)
            if k:
                ran.setdefault("/".join(k), set()).add(c)
        # a key whose cases ran different configs is named by all of them: it then matches no single shipped config
        return {k: " + ".join(sorted(names)) for k, names in sorted(ran.items())}, True
    return _names([k for k, _ in keyed], CONFIGS), False


def _matrix(path: Path, smem: str = SMEM, commit: str = RUN_COMMIT, fp8mma_max_h: int | None = None) -> dict:
    rows = json.loads(path.read_text())
    configs, recorded = _configs([(r["name"], r.get("config")) for r in rows], smem, fp8mma_max_h)
    what = "full case matrix (sparse MLA + indexer)"
    what += "" if smem == SMEM else f", {smem} shared-memory configs forced"
    what += f", fp8-cache kernel for 1-{fp8mma_max_h} heads" if fp8mma_max_h else ""
    return {"file": str(path), "commit": commit, "what": what, "recorded": recorded,
            "cases": len(rows), "passed": sum(bool(r["ok"]) for r in rows), "configs": configs}


def _sanitizer(path: Path, smem: str = SMEM, commit: str = SANITIZER_COMMIT, fp8mma_max_h: int | None = None) -> dict:
    text = path.read_text()
    cases = re.findall(r"^(sanitize:\S+)\s+(ok|BAD)\b(?:.*? config=(\S+))?", text, re.M)
    errors = re.search(r"ERROR SUMMARY: (\d+) error", text)
    what = "compute-sanitizer memcheck, invalid-index cases" + ("" if smem == SMEM else f", {smem} configs forced")
    configs, recorded = _configs([(n, c or None) for n, _, c in cases], smem, fp8mma_max_h)
    what += f", fp8-cache kernel for 1-{fp8mma_max_h} heads" if fp8mma_max_h else ""
    return {"file": str(path), "commit": commit, "what": what, "recorded": recorded,
            "cases": len(cases), "passed": sum(s == "ok" for _, s, _ in cases),
            "sanitizer_errors": int(errors[1]) if errors else None, "configs": configs}


def _verify(path: Path) -> dict:
    lines = re.findall(r"^verify (\S+)\s+(\S+)\s+(\d+)/(\d+)", path.read_text(), re.M)
    return {"file": str(path), "commit": "febd9ab", "what": "decode cases of the full matrix (H <= 16, T < 528)",
            "recorded": True,
            "cases": sum(int(n) for *_, n in lines), "passed": sum(int(ok) for *_, ok, _ in lines),
            "configs": {f"small/{fmt}/{SMEM}": name for fmt, name, _, _ in lines}}


def _bench(path: Path) -> dict:
    res = json.loads(path.read_text())
    meta = res["meta"]
    # the configs its own rows ran (each records its key and config); files without them: the table in meta
    rows = [r for r in res.get("rows", []) if r.get("config_key", "").endswith("/" + SMEM) and r.get("config")]
    configs = {r["config_key"]: r["config"] for r in rows} if rows else \
        {k: v for k, v in meta["configs"].items() if k.endswith("/" + SMEM)}
    return {"file": str(path), "commit": meta.get("commit") or "febd9ab",
            "what": "benchmark (rows with rel_err checked against fp32)", "recorded": True,
            "date": meta["date"], "configs": dict(sorted(configs.items()))}


def _harness(path: Path) -> dict:
    rows = [r for r in json.loads(path.read_text())["results"] if "kv_format" in r]  # sparse-MLA cases
    commit = json.loads(path.read_text()).get("commit") or HARNESS_COMMIT
    # the committed run (836d561) predates the fp8-cache kernel: its shapes are keyed without it
    keys = [_shape_key(sum(r["query_lens"]), r["heads"], r["kv_format"],
                       fp8mma_max_h=0 if commit == HARNESS_COMMIT else None) for r in rows]
    return {"file": str(path), "commit": commit, "what": "vLLM backend call path (paged caches, top-k 2048)",
            "recorded": False, "cases": len(rows), "passed": sum(bool(r["ok"]) for r in rows),
            "configs": _names(keys, CONFIGS)}


def coverage(root: str | Path | None = None) -> dict:
    """{"pieces": {name: summary}, "shipped": {key: {"config", "covered_by": [piece names that ran it]}}}.

    Pieces whose file is missing are left out. `root`: the checkout (default: the one this package runs from).
    """
    root = Path(root) if root is not None else (repo_root() or Path("."))
    readers = {"h200_full_matrix": (FULL_MATRIX, _matrix),
               "h200_full_matrix_smem_small": (FULL_MATRIX_SMALL, lambda p: _matrix(p, "small", SMALL_COMMIT)),
               "h200_sanitizer": (SANITIZER, _sanitizer),
               "h200_sanitizer_smem_small": (SANITIZER_SMALL, lambda p: _sanitizer(p, "small", SMALL_COMMIT)),
               "h200_full_matrix_r8": (FULL_MATRIX_R8, lambda p: _matrix(p, SMEM, R8_COMMIT, R8_FP8MMA_MAX_H)),
               "h200_sanitizer_r8": (SANITIZER_R8, lambda p: _sanitizer(p, SMEM, R8_COMMIT, R8_FP8MMA_MAX_H)),
               "h100_full_matrix": (FULL_MATRIX_H100, lambda p: _matrix(p, SMEM, H100_COMMIT)),
               "h100_full_matrix_r31": (FULL_MATRIX_H100_R31, lambda p: _matrix(p, SMEM, R31_COMMIT)),
               "h100_full_matrix_smem_small_fp8mma": (FULL_MATRIX_SMALL_FP8MMA,
                                                      lambda p: _matrix(p, "small", SMALL_FP8MMA_COMMIT)),
               "h100_sanitizer_smem_small_fp8mma": (SANITIZER_SMALL_FP8MMA,
                                                    lambda p: _sanitizer(p, "small", SMALL_FP8MMA_COMMIT)),
               "h100_sanitizer": (SANITIZER_H100, lambda p: _sanitizer(p, SMEM, H100_SANITIZER_COMMIT)),
               "h200_decode_verify_v5": (VERIFY_V5, _verify), "h200_bench": (BENCH, _bench),
               "h100_bench": (BENCH_H100, _bench),
               "h200_vllm_harness": (HARNESS, _harness)}
    pieces = {name: read(root / rel) for name, (rel, read) in readers.items() if (root / rel).is_file()}
    shipped = {}
    for key, name in shipped_configs().items():
        shipped[key] = {"config": name,
                        "covered_by": [n for n, p in pieces.items()
                                       if p["recorded"] and p["configs"].get(key) == name]}
    return {"pieces": pieces, "shipped": shipped}


def format_coverage(cov: dict) -> str:
    lines = ["| evidence | commit | cases passed | configs it ran |", "|---|---|---|---|"]
    for name, p in cov["pieces"].items():
        passed = f"{p['passed']}/{p['cases']}" if "cases" in p else "-"
        if p.get("sanitizer_errors") is not None:
            passed += f", {p['sanitizer_errors']} sanitizer errors"
        ran = ", ".join(f"{k}={v}" for k, v in p["configs"].items())
        if not p["recorded"]:
            ran = f"not recorded (by shape, today's configs: {ran})"
        lines.append(f"| {name} | {p['commit']} | {passed} | {ran} |")
    lines += ["", "| shipped config (H200) | name | run by |", "|---|---|---|"]
    for key, s in cov["shipped"].items():
        lines.append(f"| {key} | {s['config']} | {', '.join(s['covered_by']) or 'none'} |")
    return "\n".join(lines)


__all__ = ["coverage", "format_coverage", "shipped_configs"]
