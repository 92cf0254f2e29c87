"""GGUF container work: read a file or a llama.cpp shard set, split, merge, inspect, validate.

Reading (the API other parts of glm5lib build on; keep it small and stable)::

    from glm5lib.gguf import open_gguf
    g = open_gguf("GLM-5-Q4_K_M-00003-of-00010.gguf")  # any shard, or a single/merged file
    g.shards            # [Path, ...] in split.no order (one path for a single file)
    g.arch              # "glm-dsa"
    g.kv                # shard 0's metadata: {"glm-dsa.block_count": 79, "tokenizer.ggml.tokens": [...], ...}
    g.tensors           # [TensorInfo, ...] in shard order, then file order
    t = g.tensor("blk.3.ffn_down_exps.weight")
    t.name, t.ggml_type, t.ne, t.shape  # ne: ggml order; shape: torch order (reversed ne)
    t.path, t.offset, t.nbytes, t.shard  # absolute byte range of the data in its shard file
    g.raw(name)         # read-only memmap view: typed for F32/F16/F64/I*, uint16 for BF16, uint8 [..., row
                        #   bytes] for quantized types (what gguf.quants.dequantize takes)
    g.dequantize(name)  # float32, torch order, via gguf.quants.dequantize
    g.hash_tensor(name) # sha256 of the bytes, streamed in 64 MiB chunks
    g.problems          # non-fatal findings (e.g. alignment != 32); fatal ones raise GGUFFormatError

`open_gguf` finds the other shards from the `PREFIX-%05d-of-%05d.gguf` name and `split.count`, and checks
that they form one set (split.no order, split.count, split.tensors.count, no duplicates, data inside
each file). Headers are parsed without reading tensor data, so opening a 400 GB set costs its headers.

Writing: `glm5lib.gguf.split.split(IN, PREFIX, max_tensors=|max_size=, no_tensor_first_split=)` and
`glm5lib.gguf.split.merge(FIRST_SHARD, OUT)` produce the same bytes and file names as llama.cpp's `llama-gguf-split`
for 32-aligned inputs, streaming data in bounded chunks, all-or-nothing (temporary files, then rename).
Command line: `glm5lib gguf split|merge|inspect|validate|bench`.

A change goes here when it is about the container (floor 1: it knows nothing of GLM-5's tensors beyond the
architecture name); what a glm-dsa tensor means belongs in `glm5lib.model.spec` and `glm5lib.mapping`.
"""

from glm5lib.gguf.format import GGUFHeader, read_header
from glm5lib.gguf.shards import GGUFSet, TensorInfo, open_gguf, scan, shard_path

# split/merge stay in glm5lib.gguf.split (not re-exported: a function named `split` would shadow the module)
__all__ = ["open_gguf", "GGUFSet", "TensorInfo", "scan", "shard_path", "read_header", "GGUFHeader"]
