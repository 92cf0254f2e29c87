# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · GGUF shard sets: validate, merge, inspect
#
# Public GLM-5 GGUFs ship as llama.cpp shard sets, `NAME-00001-of-0000N.gguf`, ~50 GB a shard and ~400 GB
# for a Q4 quant. llama.cpp's `llama-gguf-split` splits and merges them, but holds one whole tensor in RAM
# while copying (6.4 GB for one BF16 GLM-5 expert tensor), and a failed merge leaves a partial file.
#
# `glm5lib.gguf` does the same job byte for byte (the tests compare with the real binary and with committed
# digests of its outputs), streaming data in 64 MiB chunks, writing to a temporary file and renaming it only
# when complete. This notebook walks through it:
#
# 1. **Locate** the shard set (or split a single file into one).
# 2. **Validate** the whole set from any one shard: names, `split.no` order, `split.count`, tensor totals,
#    duplicates, every tensor's bytes inside its file, alignment, types.
# 3. **Merge** it into one file (progress bar, bounded memory).
# 4. **Inspect** the result: metadata, tensors and bytes per block and type.
# 5. **Prove the merge lossless**: every tensor's bytes hashed (streamed) on both sides.
#
# By default it runs on the tiny GLM-5 model (`glm5lib.mapping.tiny`), split here with the parameters below.
# Point `GGUF_PATH` at any shard of a real set to do the same there: steps 1, 2 and 4 read headers only;
# steps 3 and 5 read every byte once (and the merge needs the set's size in free disk).

# %% tags=["parameters"]
GGUF_PATH = None  # any shard of a GGUF set, or a single file to split first; None: the tiny model (Q8_0)
TINY_TYPE = "Q8_0"  # tiny file type when GGUF_PATH is None: F32, BF16, Q8_0, Q4_0
SPLIT_MODE = "tensors"  # how a single file is split: "tensors" (SPLIT_MAX_TENSORS) or "size" (SPLIT_MAX_SIZE)
SPLIT_MAX_TENSORS = 32
SPLIT_MAX_SIZE = "1M"  # N[M|G], decimal units as llama-gguf-split
OUT_DIR = "outputs/tmp/nb01"  # scratch: shards and the merged file (replaced on re-run); relative: to the checkout
INTERACTIVE = False
PROFILE = "ci"

# %%
import time
from pathlib import Path

from IPython.display import Image, display

from glm5lib.gguf import open_gguf, scan
from glm5lib.gguf.inspect import diff_tensors, format_summary, summarize, tensor_digests
from glm5lib.gguf.plot import plot_bytes_per_block
from glm5lib.gguf.split import ensure_shards, merge
from glm5lib.paths import outputs_dir, resolve
from glm5lib.workbook import record

FIGURES = outputs_dir() / "figures"
OUT = resolve(OUT_DIR)
OUT.mkdir(parents=True, exist_ok=True)
if GGUF_PATH is None:
    from glm5lib.mapping.tiny import ensure_tiny

    GGUF_PATH = ensure_tiny(progress=False).gguf[TINY_TYPE]  # the unsplit tiny file
print("input:", GGUF_PATH)

# %% [markdown]
# ## 1. Locate the shard set
#
# Given a shard, `open_gguf` finds its siblings from the `PREFIX-%05d-of-%05d.gguf` name and `split.count`.
# Given a single file, we split it first, exactly as `llama-gguf-split --split-max-tensors N` (or
# `--split-max-size N`) would: shard 1 carries all metadata plus `split.no`, `split.tensors.count` and
# `split.count`; the others carry only those three keys.

# %%
first_shard, original = ensure_shards(GGUF_PATH, OUT / "shards", mode=SPLIT_MODE, max_tensors=SPLIT_MAX_TENSORS,
                                      max_size=SPLIT_MAX_SIZE, progress=True)
shards = open_gguf(first_shard)
print(shards)
for p, h in zip(shards.shards, shards.headers):
    print(f"  {p.name}: split.no={h.get('split.no')}  tensors={len(h.tensors)}  bytes={h.file_size:,}")
record("arch", shards.arch)
record("shard_count", len(shards.shards))
record("split_mode", SPLIT_MODE if original is not None else "given")

# %% [markdown]
# ## 2. Validate the whole set
#
# `scan` reads every shard's header (never tensor data) and lists every problem; `glm5lib gguf validate`
# prints the same list and exits 0 (clean), 1 (problems) or 2 (unreadable). The tests plant each kind of
# damage (truncation, wrong magic, missing/extra/foreign shard, unknown type, 64-byte alignment, offsets past
# the end, duplicate names, shards out of order) and check that it is reported.

# %%
_, _, problems = scan(shards.shards[-1])  # any shard finds the same set
for p in problems:
    print("problem:", p)
validate_status = "ok" if not problems else "problems"
print("validate:", validate_status)
record("validate_status", validate_status)
record("validate_problems", [str(p) for p in problems])

# %% [markdown]
# ## 3. Merge
#
# The merged file keeps shard 1's metadata with `split.count` set to 0 (so llama.cpp will not try to merge
# it again) and every tensor in shard order, each padded to 32 bytes. Data moves with `os.copy_file_range`
# in 64 MiB chunks: memory use does not depend on the tensor size.

# %%
merged_path = OUT / "merged.gguf"
t0 = time.perf_counter()
plan = merge(shards.shards[0], merged_path, force=True, progress=True)
seconds = time.perf_counter() - t0
merged = open_gguf(merged_path)
print(f"{merged_path}: {merged_path.stat().st_size:,} bytes in {seconds:.2f} s "
      f"({merged_path.stat().st_size / 1e6 / max(seconds, 1e-9):.0f} MB/s)")
record("merged_bytes", merged_path.stat().st_size)
record("merge_seconds", seconds)

# %% [markdown]
# ## 4. Inspect the merged file
#
# Key metadata, tensors and bytes per block and per type. `glm5lib gguf inspect PATH [--json]` prints the
# same from the command line, for a single file or a whole set given any shard.

# %%
summary = summarize(merged)
print(format_summary(summary))
figure = plot_bytes_per_block(summary, FIGURES / "01_bytes_per_block.png")
display(Image(str(figure)))
record("tensor_count", summary["tensor_count"])
record("tensor_bytes", summary["tensor_bytes"])
record("block_bytes", {k: v["bytes"] for k, v in summary["blocks"].items()})
record("type_bytes", {k: v["bytes"] for k, v in summary["types"].items()})
record("merged_split_count", merged.kv.get("split.count"))
record("figure", str(figure))

# %% [markdown]
# ## 5. Is the merge lossless?
#
# Every tensor's bytes are hashed in bounded chunks on both sides (no tensor is ever held whole), and names,
# order, types and shapes are compared. When we split a file ourselves, the merged file is also compared
# with that original. (The merged file is not byte-identical to the original: llama.cpp writes the split
# keys into it and trims trailing 1s from tensor shapes; the tensors are identical.)

# %%
merged_digests = tensor_digests(merged, progress=True)  # hashed once, used by both comparisons
differences = diff_tensors(shards, merged, progress=True, digests_b=merged_digests)
if original is not None:
    differences += diff_tensors(open_gguf(original), merged, progress=True, digests_b=merged_digests)
for d in differences[:20]:
    print("difference:", d)
lossless = not differences
print("lossless:", lossless, f"({len(merged.tensors)} tensors, {merged.nbytes:,} bytes compared)")
record("lossless", lossless)
record("compared_with_original", original is not None)

# %% [markdown]
# ## Interactive view
#
# With `INTERACTIVE = True`, pick a tensor and see where its bytes live in the shard set and in the merged
# file, its type, shape and first values.

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    def show(name):
        t, m = shards.tensor(name), merged.tensor(name)
        print(f"{name}: {t.type_name} shape {t.shape}, {t.nbytes:,} bytes")
        print(f"  shard {t.shard + 1}: {t.path.name} @ {t.offset:,}   merged @ {m.offset:,}")
        print("  first values:", merged.dequantize(name).reshape(-1)[:8])

    widgets.interact(show, name=widgets.Dropdown(options=[t.name for t in merged.tensors]))
