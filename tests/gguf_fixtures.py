"""Deterministic GLM-dsa-like GGUF files for the GGUF tool tests (gguf-py's GGUFWriter, fixed seeds).

The bytes depend only on this file, numpy's PCG64 stream and gguf-py 0.19.0; `tests/golden/gguf_split.txt`
records the fixture's own sha256 so a change here (or in gguf-py) shows up as "fixture changed" rather than
as a split/merge mismatch.

Shapes are chosen so that most tensor sizes are not multiples of 32 bytes (padding is exercised), one tensor
has a trailing ggml dimension of 1 (llama.cpp trims it from n_dims), and the file is ~3.1 MB so that
`--split-max-size 1M` (llama.cpp takes only M/G units) gives several shards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize

ARCH = "glm-dsa"
HIDDEN, VOCAB, Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD, HEADS = 70, 5003, 32, 16, 4, 12, 8, 2
FFN, EXPERTS, EXPERT_FFN, INDEX_HEADS, INDEX_DIM = 64, 8, 256, 2, 8
BLOCKS, DENSE = 3, 1


def _tensors(vocab: int) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, torch shape, type) in GLM-5's GGUF order and naming (docs/glm5.md section 4)."""
    out = [("token_embd.weight", (vocab, HIDDEN), Q.BF16)]
    for i in range(BLOCKS):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (HIDDEN,), Q.F32),
            (b + "attn_q_a.weight", (Q_LORA, HIDDEN), Q.BF16),
            (b + "attn_q_a_norm.weight", (Q_LORA,), Q.F32),
            (b + "attn_q_b.weight", (HEADS * (NOPE + ROPE) + 8, Q_LORA), Q.Q8_0),
            (b + "attn_kv_a_mqa.weight", (KV_LORA + ROPE, HIDDEN), Q.BF16),
            (b + "attn_kv_a_norm.weight", (KV_LORA,), Q.F32),
            (b + "attn_k_b.weight", (HEADS, KV_LORA, NOPE), Q.F32),
            (b + "attn_v_b.weight", (HEADS, V_HEAD, KV_LORA), Q.F32),
            (b + "attn_output.weight", (HIDDEN, HEADS * V_HEAD), Q.BF16),
            (b + "indexer.attn_q_b.weight", (INDEX_HEADS * INDEX_DIM, Q_LORA), Q.BF16),
            (b + "indexer.attn_k.weight", (INDEX_DIM, HIDDEN), Q.BF16),
            (b + "indexer.k_norm.weight", (INDEX_DIM,), Q.F32),
            (b + "indexer.k_norm.bias", (INDEX_DIM,), Q.F32),
            (b + "indexer.proj.weight", (INDEX_HEADS, HIDDEN), Q.BF16),
            (b + "ffn_norm.weight", (HIDDEN,), Q.F32),
        ]
        if i < DENSE:
            out += [
                (b + "ffn_gate.weight", (FFN, HIDDEN), Q.BF16),
                (b + "ffn_up.weight", (FFN, HIDDEN), Q.BF16),
                (b + "ffn_down.weight", (HIDDEN, FFN), Q.Q8_0),
            ]
        else:
            out += [
                (b + "ffn_gate_inp.weight", (EXPERTS, HIDDEN), Q.F32),
                (b + "exp_probs_b.bias", (1, EXPERTS), Q.F32),  # ggml ne (8, 1): a trailing 1 to trim
                (b + "ffn_gate_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), Q.BF16),
                (b + "ffn_up_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), Q.BF16),
                (b + "ffn_down_exps.weight", (EXPERTS, HIDDEN, EXPERT_FFN), Q.Q8_0),
                (b + "ffn_gate_shexp.weight", (EXPERT_FFN, HIDDEN), Q.BF16),
                (b + "ffn_up_shexp.weight", (EXPERT_FFN, HIDDEN), Q.BF16),
                (b + "ffn_down_shexp.weight", (HIDDEN, EXPERT_FFN), Q.Q8_0),
            ]
    out += [("output_norm.weight", (HIDDEN,), Q.F32), ("output.weight", (vocab, HIDDEN), Q.BF16)]
    return out


def _data(rng: np.random.Generator, shape: tuple[int, ...], qtype: Q) -> np.ndarray:
    values = rng.standard_normal(shape, dtype=np.float32)
    if qtype == Q.F32:
        return values
    if qtype == Q.BF16:
        return (values.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact and deterministic
    return quantize(values, qtype)  # uint8, byte-shaped; gguf-py's numpy Q8_0 quantizer


def make_fixture(path: str | Path, seed: int = 0, *, vocab: int = VOCAB, extra_kv: bool = True) -> Path:
    """Write the fixture to `path` (deterministic for given arguments) and return the path.

    `vocab=10007` makes token_embd 1.4 MB, larger than `--split-max-size 1M`: llama-gguf-split then refuses
    (a shard would hold 0 tensors).
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, arch=ARCH)
    w.add_name("glm5lib tiny GGUF fixture")
    a = ARCH
    w.add_uint32(f"{a}.block_count", BLOCKS)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", HIDDEN)
    w.add_uint32(f"{a}.feed_forward_length", FFN)
    w.add_uint32(f"{a}.attention.head_count", HEADS)
    w.add_uint32(f"{a}.attention.head_count_kv", 1)
    w.add_uint32(f"{a}.attention.key_length", KV_LORA + ROPE)
    w.add_uint32(f"{a}.attention.value_length", KV_LORA)
    w.add_uint32(f"{a}.attention.q_lora_rank", Q_LORA)
    w.add_uint32(f"{a}.attention.kv_lora_rank", KV_LORA)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", 1e6)
    w.add_uint32(f"{a}.rope.dimension_count", ROPE)
    w.add_uint32(f"{a}.leading_dense_block_count", DENSE)
    w.add_uint32(f"{a}.expert_count", EXPERTS)
    w.add_uint32(f"{a}.expert_used_count", 2)
    w.add_float32(f"{a}.expert_weights_scale", 2.5)
    w.add_bool(f"{a}.expert_weights_norm", True)
    w.add_uint32(f"{a}.expert_gating_func", 2)
    w.add_uint32(f"{a}.attention.indexer.head_count", INDEX_HEADS)
    w.add_uint32(f"{a}.attention.indexer.key_length", INDEX_DIM)
    w.add_uint32(f"{a}.attention.indexer.top_k", 16)
    w.add_string("tokenizer.ggml.model", "gpt2")
    tokens = [f"tok{i}" for i in range(61)] + ["<|endoftext|>", "ü€"]
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [1] * (len(tokens) - 2) + [3, 1])
    w.add_array("tokenizer.ggml.merges", ["t o", "to k"])
    if extra_kv:  # every scalar and array type llama.cpp reads
        w.add_uint8("glm5lib.test.u8", 7)
        w.add_int8("glm5lib.test.i8", -7)
        w.add_uint16("glm5lib.test.u16", 65535)
        w.add_int16("glm5lib.test.i16", -300)
        w.add_int32("glm5lib.test.i32", -(2**31))
        w.add_uint64("glm5lib.test.u64", 2**64 - 1)
        w.add_int64("glm5lib.test.i64", -(2**63))
        w.add_float64("glm5lib.test.f64", 1 / 3)
        w.add_bool("glm5lib.test.false", False)
        w.add_array("glm5lib.test.f32s", [0.5, -1.25, 3.0])
        w.add_array("glm5lib.test.bools", [True, False, True])
    for name, shape, qtype in _tensors(vocab):
        w.add_tensor(name, _data(rng, shape, qtype), raw_dtype=None if qtype == Q.F32 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------------------
# The split cases compared with llama.cpp's llama-gguf-split, and where that binary lives.

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "gguf_split.txt"

# name -> llama-gguf-split options; ours take the same flags (glm5lib gguf split IN PREFIX ...)
SPLIT_CASES = {
    "default": [],
    "tensors20": ["--split-max-tensors", "20"],
    "tensors1": ["--split-max-tensors", "1"],
    "tensors67": ["--split-max-tensors", "67"],
    "size1M": ["--split-max-size", "1M"],
    "size2M": ["--split-max-size", "2M"],
    "tensors20-nofirst": ["--split-max-tensors", "20", "--no-tensor-first-split"],
    "size1M-nofirst": ["--split-max-size", "1M", "--no-tensor-first-split"],
}


def llama_gguf_split() -> Path | None:
    """The reference binary: $GLM5LIB_LLAMA_GGUF_SPLIT, or what scripts/build_llama_gguf_split.sh builds."""
    import os

    env = os.environ.get("GLM5LIB_LLAMA_GGUF_SPLIT")
    path = Path(env) if env else REPO / ".cache" / "llama.cpp" / "build" / "bin" / "llama-gguf-split"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def sha256(path: str | Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_golden(path: Path = GOLDEN) -> dict[str, str]:
    """'key sha256' lines -> {key: sha256}; keys are 'fixture', 'CASE/FILE' and 'CASE/merged'."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, digest = line.split()
            out[key] = digest
    return out


def write_golden(binary: Path, workdir: Path, path: Path = GOLDEN) -> dict[str, str]:
    """Regenerate the golden digests by running the real llama-gguf-split on the fixture, every case."""
    import subprocess

    fixture = make_fixture(workdir / "fixture.gguf")
    digests = {"fixture": sha256(fixture)}
    for case, flags in SPLIT_CASES.items():
        out = workdir / case
        out.mkdir()
        subprocess.run([str(binary), *flags, str(fixture), str(out / "m")], check=True, capture_output=True)
        shards = sorted(out.glob("m-*.gguf"))
        for p in shards:
            digests[f"{case}/{p.name}"] = sha256(p)
        subprocess.run([str(binary), "--merge", str(shards[0]), str(out / "merged.gguf")], check=True,
                       capture_output=True)
        digests[f"{case}/merged"] = sha256(out / "merged.gguf")
    lines = [
        "# sha256 of llama-gguf-split outputs (llama.cpp vendored in llama-cpp-python 0.3.36) on",
        "# tests/gguf_fixtures.make_fixture(seed=0). Regenerate: python tests/gguf_fixtures.py --golden",
    ] + [f"{k} {v}" for k, v in digests.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return digests


if __name__ == "__main__":
    import sys
    import tempfile

    if sys.argv[1:] != ["--golden"]:
        sys.exit("usage: python tests/gguf_fixtures.py --golden   (needs llama-gguf-split, see scripts/)")
    binary = llama_gguf_split()
    if binary is None:
        sys.exit("llama-gguf-split not found: run scripts/build_llama_gguf_split.sh or set GLM5LIB_LLAMA_GGUF_SPLIT")
    with tempfile.TemporaryDirectory() as tmp:
        for key, digest in write_golden(binary, Path(tmp)).items():
            print(digest, key)
