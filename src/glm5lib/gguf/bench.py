"""Split/merge throughput and peak memory on a synthetic multi-GB GGUF, next to a plain `cp` of the same file.

Each step runs in its own child process; its wall time is measured inside the child (interpreter start-up
excluded) and its peak RSS comes from `os.wait4`'s rusage. Every step ends with an fsync of what it wrote
(`cp` is followed by `sync` of the copy) so that the rates are the disk's, not the page cache's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType
from tqdm.auto import tqdm

from glm5lib.gguf.format import KV, OutTensor, encode_header, pad
from glm5lib.gguf.shards import open_gguf

# The timed operation, in a fresh interpreter; imports happen before the clock starts.
_CHILD = """
import json, os, sys, time
from glm5lib.gguf.split import merge, split
from glm5lib.progress import show_progress
op, args = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
if op == "split":
    outs = [p.path for p in split(args[0], args[1], max_size=int(args[2]), progress=False)]
else:
    outs = [merge(args[0], args[1], progress=False).path]
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""

# Peak RSS of a command, measured from a small parent: a child's ru_maxrss starts at its parent's RSS at fork
# time (Linux keeps the pre-exec high-water mark), so the big benchmark process must not be that parent.
_WRAP = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ)
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - t0,
                  "peak_rss_kb": usage.ru_maxrss}))
"""


def _run(argv: list[str]) -> dict[str, Any]:
    """Run a command; wall time (the child's own if it prints {"seconds": ...}) and its peak RSS."""
    proc = subprocess.run([sys.executable, "-S", "-c", _WRAP, *argv], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    wrap = json.loads(lines[-1]) if lines else {"rc": proc.returncode}
    if proc.returncode != 0 or wrap["rc"] != 0:
        raise RuntimeError(f"{argv[0]} failed ({wrap['rc']}): {proc.stderr[-2000:]}")
    result = {"seconds": wrap["seconds"], "peak_rss_mb": wrap["peak_rss_kb"] / 1024}
    if len(lines) > 1:
        result["seconds"] = json.loads(lines[-2])["seconds"]
    return result


def make_synthetic(path: Path, size: int, tensor_size: int, progress: bool = True) -> dict[str, Any]:
    """A GLM-dsa-named GGUF of about `size` bytes: BF16 expert-like tensors of `tensor_size` bytes plus norms.

    Data are real bytes (a random 64 MiB block, varied per chunk), not holes, so every copy moves them.
    """
    sizes = [tensor_size] * (size // tensor_size) + ([size % tensor_size] if size % tensor_size else [])
    n_big = len(sizes)
    tensors = []
    for i, nbytes in enumerate(sizes):
        ne = (6144, max(1, nbytes // (2 * 6144)))
        tensors.append(OutTensor(f"blk.{i}.ffn_up_exps.weight", ne, GGMLQuantizationType.BF16, 2 * ne[0] * ne[1],
                                 path, 0))
        tensors.append(OutTensor(f"blk.{i}.ffn_norm.weight", (6144 + 7,), GGMLQuantizationType.F32,
                                 4 * (6144 + 7), path, 0))
    kvs = [KV("general.architecture", GGUFValueType.STRING, "glm-dsa"),
           KV("glm-dsa.block_count", GGUFValueType.UINT32, n_big)]
    header = encode_header(kvs, tensors)
    block = np.frombuffer(np.random.default_rng(0).bytes(64 << 20), dtype=np.uint64).copy()
    t0 = time.perf_counter()
    with open(path, "wb") as f, tqdm(total=sum(t.nbytes for t in tensors), unit="B", unit_scale=True,
                                     desc="synthetic", disable=not show_progress(progress)) as bar:
        f.write(header)
        counter = 0
        for t in tensors:
            left = t.nbytes
            while left:
                block[0] = counter  # every chunk differs
                counter += 1
                n = min(left, block.nbytes)
                f.write(memoryview(block).cast("B")[:n])
                left -= n
                bar.update(n)
            f.write(b"\0" * (pad(t.nbytes) - t.nbytes))
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": path.stat().st_size, "tensors": len(tensors), "largest_tensor": max(t.nbytes for t in tensors),
            "seconds": time.perf_counter() - t0}


def run_bench(directory: str | os.PathLike, size: int = 2 * 1000**3, tensor_size: int = 512 * 1000**2,
              llama: str | None = None, keep: bool = False, rounds: int = 3, progress: bool = True) -> dict[str, Any]:
    """Split and merge a synthetic file `rounds` times, each round next to a `cp` of it; medians reported.

    The disk may be shared and its pace drifts, so cp/split/merge are interleaved round by round and the
    merge/cp ratio is taken per round (paired) as well as from the medians.
    """
    d = Path(directory) / f"glm5lib-gguf-bench-{os.getpid()}"
    d.mkdir(parents=True)
    py = sys.executable
    try:
        src = d / "synthetic.gguf"
        result: dict[str, Any] = {"dir": str(d), "rounds": rounds,
                                  "synthetic": make_synthetic(src, size, tensor_size, progress)}
        nbytes = result["synthetic"]["bytes"]
        shard_size = max(tensor_size + 1, size // 3)  # a few shards, each holding whole big tensors
        runs: dict[str, list[dict[str, Any]]] = {"cp": [], "split": [], "merge": []}
        for _ in tqdm(range(rounds), desc="rounds", disable=not show_progress(progress)):
            # cp + sync: the plain large-file copy that sets the disk's pace (split/merge fsync what they write)
            runs["cp"].append(_run(["sh", "-c", f"cp '{src}' '{d / 'copy.gguf'}' && sync '{d / 'copy.gguf'}'"]))
            (d / "copy.gguf").unlink()
            for old in d.glob("s-*.gguf"):
                old.unlink()
            runs["split"].append(_run([py, "-c", _CHILD, "split", str(src), str(d / "s"), str(shard_size)]))
            (d / "merged.gguf").unlink(missing_ok=True)
            first = sorted(d.glob("s-00001-of-*.gguf"))[0]
            runs["merge"].append(_run([py, "-c", _CHILD, "merge", str(first), str(d / "merged.gguf")]))
        if llama:  # once: the point is its memory, which grows with the largest tensor
            (d / "ref").mkdir()
            mb = max(1, shard_size // 1000**2)
            runs["llama_split"] = [_run(["sh", "-c", f"'{llama}' --split-max-size {mb}M '{src}' '{d / 'ref' / 's'}' "
                                         f">/dev/null && sync '{d / 'ref'}'/*"])]
            ref_first = sorted((d / "ref").glob("s-00001-of-*.gguf"))[0]
            runs["llama_merge"] = [_run(["sh", "-c", f"'{llama}' --merge '{ref_first}' '{d / 'ref.gguf'}' "
                                         f">/dev/null 2>&1 && sync '{d / 'ref.gguf'}'"])]
        steps = {}
        for name, rs in runs.items():
            rates = [nbytes / 1e6 / r["seconds"] for r in rs]
            steps[name] = {"mb_per_s": float(np.median(rates)), "mb_per_s_runs": rates,
                           "seconds": float(np.median([r["seconds"] for r in rs])),
                           "peak_rss_mb": max(r["peak_rss_mb"] for r in rs)}
        result["steps"] = steps
        result["disk_mb_per_s"] = steps["cp"]["mb_per_s"]
        result["merge_vs_cp"] = steps["merge"]["mb_per_s"] / steps["cp"]["mb_per_s"]
        result["split_vs_cp"] = steps["split"]["mb_per_s"] / steps["cp"]["mb_per_s"]
        result["merge_vs_cp_per_round"] = [m / c for m, c in zip(steps["merge"]["mb_per_s_runs"],
                                                                 steps["cp"]["mb_per_s_runs"])]
        # not timed: the merge is lossless (every tensor's bytes, streamed hashes)
        result["lossless"] = _same_tensors(src, d / "merged.gguf")
        if llama:
            result["merge_identical_to_llama"] = _same_file(d / "merged.gguf", d / "ref.gguf")
        return result
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def _same_tensors(a: Path, b: Path) -> bool:
    ga, gb = open_gguf(a), open_gguf(b)
    return [t.name for t in ga.tensors] == [t.name for t in gb.tensors] and all(
        ga.hash_tensor(t.name, "md5") == gb.hash_tensor(t.name, "md5") for t in ga.tensors)


def _same_file(a: Path, b: Path, chunk: int = 64 << 20) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                return False
            if not x:
                return True


def format_bench(r: dict[str, Any]) -> str:
    s = r["synthetic"]
    lines = [f"synthetic file: {s['bytes'] / 1e9:.2f} GB, {s['tensors']} tensors, largest {s['largest_tensor'] / 1e6:.0f} MB "
             f"(written at {s['bytes'] / 1e6 / s['seconds']:.0f} MB/s)",
             f"{'step':<12} {'seconds':>8} {'MB/s':>8} {'peak RSS MB':>12}  MB/s per round "
             f"(median of {r['rounds']} rounds, cp/split/merge interleaved)"]
    for name, st in r["steps"].items():
        per = " ".join(f"{x:.0f}" for x in st["mb_per_s_runs"])
        lines.append(f"{name:<12} {st['seconds']:>8.2f} {st['mb_per_s']:>8.0f} {st['peak_rss_mb']:>12.0f}  {per}")
    paired = " ".join(f"{x:.2f}" for x in r["merge_vs_cp_per_round"])
    lines.append(f"merge / cp throughput: {r['merge_vs_cp']:.2f} (per round: {paired})   "
                 f"split / cp: {r['split_vs_cp']:.2f}   lossless: {r['lossless']}")
    if "merge_identical_to_llama" in r:
        lines.append(f"merge byte-identical to llama-gguf-split: {r['merge_identical_to_llama']}")
    return "\n".join(lines)
