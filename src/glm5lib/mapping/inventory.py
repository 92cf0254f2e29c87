"""What a glm-dsa GGUF must hold (the expected inventory) and `check`: what a given file holds instead.

`check` reads only metadata and tensor infos (no tensor data), so it takes seconds on a 400 GB shard set.
It reports:
- problems: missing, unexpected and misshapen tensors, types a tensor may not have (F32-only tensors quantized,
  rows not a whole number of blocks), metadata that contradicts itself or the tensor shapes, a config.json
  that disagrees with the file;
- notes: tensors whose type differs from the file's main type for a known reason (the block-32 fallbacks on
  `attn_k_b`, whose 192-wide rows no 256-block type divides), config fields GGUF does not carry;
- bytes per tensor kind.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from glm5lib.errors import GGUFFormatError
from glm5lib.model.quant import is_quantized_by_llama
from glm5lib.model.spec import GGUF_ARCH, GLM5Config, TensorSpec, gguf_tensor_specs, split_block_name
from glm5lib.mapping.config import compare_hf_configs, config_from_kv

# Types that hold model weights (not integer tensors); any of them may store a "main" tensor whose rows it divides.
_NOT_WEIGHTS = {"I8", "I16", "I32", "I64", "F64"}
WEIGHT_TYPES = tuple(t for t in GGML_QUANT_SIZES if t.name not in _NOT_WEIGHTS)
F32_ONLY = (GGMLQuantizationType.F32,)


@dataclass(frozen=True)
class ExpectedTensor:
    spec: TensorSpec
    allowed_types: tuple[GGMLQuantizationType, ...]

    @property
    def name(self) -> str:
        return self.spec.gguf_name

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        return self.spec.ggml_shape


def allowed_types(spec: TensorSpec) -> tuple[GGMLQuantizationType, ...]:
    if not is_quantized_by_llama(spec):
        return F32_ONLY  # norms, biases, the router: neither llama.cpp's converter nor llama-quantize quantizes them
    # Any type whose blocks divide the rows. indexer.proj is written F32 by the converter, but it is a 2-D weight,
    # so llama-quantize quantizes it with the rest.
    row = spec.ggml_shape[0]
    return tuple(t for t in WEIGHT_TYPES if row % GGML_QUANT_SIZES[t][0] == 0)


def expected_inventory(cfg: GLM5Config, *, include_mtp: bool = True) -> list[ExpectedTensor]:
    """Every tensor a glm-dsa file of this config holds, with its ggml shape and the types it may have.

    1,809 tensors for GLM-5 with MTP; GLM-5.2 'shared' layers have no indexer tensors."""
    return [ExpectedTensor(s, allowed_types(s)) for s in gguf_tensor_specs(cfg, include_mtp=include_mtp)]


# ---- the report --------------------------------------------------------------------------------------------------


@dataclass
class Finding:
    category: str  # layout | missing | unexpected | misshapen | type | metadata | config | fallback | note
    message: str
    tensor: str | None = None

    @property
    def is_problem(self) -> bool:
        return self.category not in ("fallback", "note")

    def as_dict(self) -> dict[str, Any]:
        return {"category": self.category, "problem": self.is_problem, "tensor": self.tensor, "message": self.message}


@dataclass
class CheckReport:
    path: str
    shards: int
    n_tensors: int
    n_expected: int
    config: dict[str, Any]
    main_type: str | None
    findings: list[Finding] = field(default_factory=list)
    bytes_by_kind: dict[str, int] = field(default_factory=dict)
    types_by_kind: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.is_problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def count(self, category: str) -> int:
        return sum(f.category == category for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "ok": self.ok, "shards": self.shards, "tensors": self.n_tensors,
            "expected_tensors": self.n_expected, "main_type": self.main_type,
            "counts": dict(Counter(f.category for f in self.findings)),
            "findings": [f.as_dict() for f in self.findings],
            "bytes_by_kind": self.bytes_by_kind, "types_by_kind": self.types_by_kind,
            "total_bytes": sum(self.bytes_by_kind.values()), "config": self.config,
        }

    def format_text(self, *, max_lines: int = 40) -> str:
        lines = [f"{self.path}: {self.n_tensors} tensors in {self.shards} file(s), expected {self.n_expected}; "
                 f"main type {self.main_type}"]
        for cat in ("layout", "missing", "unexpected", "misshapen", "type", "metadata", "config", "fallback", "note"):
            items = [f for f in self.findings if f.category == cat]
            if not items:
                continue
            lines.append(f"{cat} ({len(items)}{', problem' if items[0].is_problem else ''}):")
            lines.extend(f"  {f.message}" for f in items[:max_lines])
            if len(items) > max_lines:
                lines.append(f"  ... {len(items) - max_lines} more")
        lines.append("bytes by tensor kind:")
        total = sum(self.bytes_by_kind.values()) or 1
        for kind, n in sorted(self.bytes_by_kind.items(), key=lambda kv: -kv[1]):
            types = ",".join(f"{t}x{c}" for t, c in sorted(self.types_by_kind.get(kind, {}).items()))
            lines.append(f"  {kind:32s} {_human(n):>10s} {100 * n / total:5.1f}%  {types}")
        lines.append(f"  {'total':32s} {_human(total):>10s}")
        lines.append("OK: consistent" if self.ok else f"PROBLEMS: {len(self.problems)}")
        return "\n".join(lines)


def _gguf_py_known(name: str) -> bool:
    """Whether gguf-py lists `name` among glm-dsa tensors (e.g. nextn.embed_tokens / nextn.shared_head_head, which
    llama.cpp's converter drops because they duplicate token_embd / output)."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES

    block, kind = split_block_name(name)
    base = kind.rsplit(".", 1)[0] if kind.endswith((".weight", ".bias")) else kind
    for t in MODEL_TENSORS[MODEL_ARCH.GLM_DSA]:
        fmt = TENSOR_NAMES[t]
        if (block is None and fmt == base) or (block is not None and fmt == "blk.{bid}." + base):
            return True
    return False


def _human(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _kind(name: str) -> str:
    return split_block_name(name)[1]


def _metadata_findings(kv: dict[str, Any], cfg: GLM5Config, shapes: dict[str, tuple[int, ...]]) -> list[Finding]:
    """Metadata that contradicts itself or the tensors. `shapes` are ggml ne of the tensors present."""
    a = GGUF_ARCH
    out: list[Finding] = []

    def bad(msg: str, tensor: str | None = None) -> None:
        out.append(Finding("metadata", msg, tensor))

    key_len, val_len = kv.get(f"{a}.attention.key_length"), kv.get(f"{a}.attention.value_length")
    if key_len is not None and key_len != cfg.kv_lora_rank + cfg.qk_rope_head_dim:
        bad(f"attention.key_length is {key_len}, but absorbed MLA keys are kv_lora_rank + rope = "
            f"{cfg.kv_lora_rank} + {cfg.qk_rope_head_dim} = {cfg.mla_qk_dim}")
    if val_len is not None and val_len != cfg.kv_lora_rank:
        bad(f"attention.value_length {val_len} != kv_lora_rank {cfg.kv_lora_rank}")
    if kv.get(f"{a}.attention.head_count_kv", 1) != 1:
        bad(f"attention.head_count_kv is {kv.get(f'{a}.attention.head_count_kv')}, glm-dsa stores 1 (one latent head)")
    if cfg.num_experts_per_tok > cfg.n_routed_experts:
        bad(f"expert_used_count {cfg.num_experts_per_tok} > expert_count {cfg.n_routed_experts}")
    if not 0 <= cfg.first_k_dense_replace <= cfg.num_hidden_layers:
        bad(f"leading_dense_block_count {cfg.first_k_dense_replace} outside 0..{cfg.num_hidden_layers}")
    if cfg.rope_theta <= 0:
        bad(f"rope.freq_base {cfg.rope_theta} is not positive")
    types = kv.get(f"{a}.attention.indexer.types")
    if types is not None and len(types) != cfg.num_hidden_layers:
        bad(f"attention.indexer.types has {len(types)} entries for {cfg.num_hidden_layers} layers")
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is None:
        bad("no tokenizer.ggml.tokens: no tokenizer can be rebuilt for export or serving")
    elif not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        bad("tokenizer.ggml.tokens is not an array of strings")
        tokens = None
    elif len(tokens) != cfg.vocab_size:
        bad(f"vocab_size {cfg.vocab_size} but tokenizer.ggml.tokens has {len(tokens)} tokens")
    if tokens is not None:
        for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
            tid = kv.get(f"tokenizer.ggml.{key}")
            if tid is not None and not (isinstance(tid, int) and 0 <= tid < len(tokens)):
                bad(f"tokenizer.ggml.{key} is {tid!r}, not a token id (0..{len(tokens) - 1})")

    # Metadata vs the tensors that carry each dimension (first block of each kind that is present).
    def dim(name: str, axis: int) -> int | None:
        ne = shapes.get(name)
        return ne[axis] if ne is not None and len(ne) > axis else None

    first_moe = next((i for i in range(cfg.num_layers_total) if cfg.is_moe_layer(i)), None)
    checks = [
        ("embedding_length", cfg.hidden_size, "token_embd.weight", 0),
        ("vocab_size", cfg.vocab_size, "token_embd.weight", 1),
        ("attention.q_lora_rank", cfg.q_lora_rank, "blk.0.attn_q_a_norm.weight", 0),
        ("attention.kv_lora_rank", cfg.kv_lora_rank, "blk.0.attn_kv_a_norm.weight", 0),
        ("attention.head_count", cfg.num_attention_heads, "blk.0.attn_k_b.weight", 2),
        ("attention.head_count x key_length_mla", cfg.num_attention_heads * cfg.qk_head_dim,
         "blk.0.attn_q_b.weight", 1),
        ("attention.key_length_mla - rope.dimension_count", cfg.qk_nope_head_dim, "blk.0.attn_k_b.weight", 0),
        ("attention.value_length_mla", cfg.v_head_dim, "blk.0.attn_v_b.weight", 1),
        ("attention.key_length (kv_a_mqa rows)", kv.get(f"{a}.attention.key_length"), "blk.0.attn_kv_a_mqa.weight", 1),
        ("attention.indexer.head_count", cfg.index_n_heads, "blk.0.indexer.proj.weight", 1),
        ("attention.indexer.key_length", cfg.index_head_dim, "blk.0.indexer.attn_k.weight", 1),
    ]
    if cfg.first_k_dense_replace > 0:
        checks.append(("feed_forward_length", cfg.intermediate_size, "blk.0.ffn_gate.weight", 1))
    if first_moe is not None:
        b = f"blk.{first_moe}."
        checks += [
            ("expert_count", cfg.n_routed_experts, b + "ffn_gate_exps.weight", 2),
            ("expert_count (router)", cfg.n_routed_experts, b + "ffn_gate_inp.weight", 1),
            ("expert_feed_forward_length", cfg.moe_intermediate_size, b + "ffn_gate_exps.weight", 1),
            ("expert_feed_forward_length x expert_shared_count", cfg.moe_intermediate_size * cfg.n_shared_experts,
             b + "ffn_gate_shexp.weight", 1),
        ]
    for what, meta, tensor, axis in checks:
        got = dim(tensor, axis)
        if meta is not None and got is not None and got != meta:
            bad(f"{what} is {meta} but {tensor} ne[{axis}] is {got}", tensor)

    # Which blocks exist, and which hold dense vs expert FFNs, vs block_count / leading_dense_block_count.
    blocks = {split_block_name(n)[0] for n in shapes} - {None}
    if blocks and max(blocks) + 1 != cfg.num_layers_total:
        bad(f"block_count {cfg.num_layers_total} but the highest block is blk.{max(blocks)}")
    dense = sorted(i for i in blocks if f"blk.{i}.ffn_gate.weight" in shapes)
    if dense and dense != list(range(cfg.first_k_dense_replace)):
        bad(f"leading_dense_block_count {cfg.first_k_dense_replace} but dense FFN blocks are {dense}")
    return out


def _type_findings(present: dict[str, Any], expected: dict[str, ExpectedTensor], main: GGMLQuantizationType | None
                   ) -> list[Finding]:
    out = []
    for name, info in present.items():
        exp = expected.get(name)
        if exp is None:
            continue
        t = info.ggml_type
        if t not in exp.allowed_types:
            why = "must stay F32" if exp.allowed_types == F32_ONLY else \
                f"rows of {exp.ggml_shape[0]} are not a whole number of {t.name} blocks"
            out.append(Finding("type", f"{name} is {t.name}: {why}", name))
        elif exp.spec.storage == "main" and main is not None and t != main:
            row, block = exp.ggml_shape[0], GGML_QUANT_SIZES[main][0]
            if row % block:
                out.append(Finding("fallback", f"{name} is {t.name}, not the main {main.name}: rows of {row} do not "
                                   f"divide {main.name}'s {block}-blocks (llama.cpp's block-32 fallback)", name))
            else:
                out.append(Finding("note", f"{name} is {t.name}, the main type is {main.name} (mixed quant)", name))
    return out


def _shape_hint(name: str, shape: tuple[int, ...], expected: dict[str, ExpectedTensor]) -> str:
    exp = expected[name]
    if len(shape) == len(exp.ggml_shape) >= 2 and tuple(shape[:2]) == tuple(reversed(exp.ggml_shape[:2])) \
            and tuple(shape[2:]) == tuple(exp.ggml_shape[2:]):
        return " (first two dims transposed)"
    block, kind = split_block_name(name)
    partner = {"attn_k_b.weight": "attn_v_b.weight", "attn_v_b.weight": "attn_k_b.weight"}.get(kind)
    if partner and block is not None:
        other = expected.get(f"blk.{block}.{partner}")
        if other is not None and tuple(shape) == other.ggml_shape:
            return f" (has the shape of {partner}: k_b/v_b swapped?)"
    return ""


def check_set(gs: Any, *, config: dict[str, Any] | None = None, path: str | None = None) -> CheckReport:
    """Check an opened GGUF set (see module docstring). `config`: a config.json dict to compare with."""
    kv = gs.kv
    try:
        cfg = config_from_kv(kv)
    except GGUFFormatError as exc:  # name the file: the message only knows the key
        raise GGUFFormatError(f"{path or gs.shards[0]}: {exc}") from None
    present = {t.name: t for t in gs.tensors}
    has_mtp = cfg.num_nextn_predict_layers > 0
    inventory = expected_inventory(cfg, include_mtp=has_mtp)
    expected = {e.name: e for e in inventory}
    shapes = {n: tuple(t.ne) for n, t in present.items()}

    # The file's main type: the most common type (by bytes) among tensors that may be quantized.
    by_type: Counter = Counter()
    for name, t in present.items():
        if name in expected and expected[name].spec.storage == "main":
            by_type[t.ggml_type] += t.nbytes
    main = by_type.most_common(1)[0][0] if by_type else None

    report = CheckReport(path=str(path or gs.shards[0]), shards=len(gs.shards), n_tensors=len(present),
                         n_expected=len(inventory), config=cfg.to_hf_dict(), main_type=main.name if main is not None else None)
    F = report.findings
    missing = [e for e in inventory if e.name not in present]
    missing_blocks = defaultdict(list)
    for e in missing:
        missing_blocks[e.spec.block].append(e.spec.kind)
        F.append(Finding("missing", f"{e.name} (ggml {list(e.ggml_shape)})", e.name))
    # A GLM-5.2 IndexShare file written without indexer.types looks like "all indexer tensors missing" per layer.
    idx_only = [b for b, kinds in missing_blocks.items() if b is not None and kinds and
                all(k.startswith("indexer.") for k in kinds) and len(kinds) == 5]
    if idx_only and f"{GGUF_ARCH}.attention.indexer.types" not in kv:
        F.append(Finding("metadata", f"blocks {sorted(idx_only)} have no indexer tensors but the file has no "
                         f"attention.indexer.types: a GLM-5.2 IndexShare file missing that key?"))
    for name, t in present.items():
        if name not in expected:
            hint = ""
            if _kind(name) == "attn_kv_b.weight":
                hint = " (legacy DeepSeek layout: glm-dsa stores attn_k_b + attn_v_b)"
            elif split_block_name(name)[0] is not None and split_block_name(name)[0] >= cfg.num_layers_total:
                hint = f" (block beyond block_count {cfg.num_layers_total})"
            elif _gguf_py_known(name) and "nextn." in name:
                F.append(Finding("note", f"{name}: an MTP tensor gguf-py knows but llama.cpp's glm-dsa converter "
                                 f"drops (duplicates token_embd/output); ignored by the mapping", name))
                continue
            F.append(Finding("unexpected", f"{name} ({t.ggml_type.name}, ggml {list(t.ne)}){hint}", name))
    for name, t in present.items():
        exp = expected.get(name)
        if exp is None:
            continue
        got = tuple(t.ne) + (1,) * (len(exp.ggml_shape) - len(t.ne))  # ggml drops trailing 1s
        if got != exp.ggml_shape:
            F.append(Finding("misshapen", f"{name}: ggml {list(t.ne)}, expected {list(exp.ggml_shape)}"
                             f"{_shape_hint(name, got, expected)}", name))
    for p in gs.layout_problems:  # the same refusal every read of tensor data makes
        F.append(Finding("layout", f"{p}: tensor data cannot be read (llama.cpp refuses such a file)"))
    F.extend(_type_findings(present, expected, main))
    F.extend(_metadata_findings(kv, cfg, shapes))
    if config is not None:
        for d in compare_hf_configs(cfg.to_hf_dict(), config):
            F.append(Finding("config" if d.severity == "problem" else "note", str(d)))

    for name, t in present.items():
        kind = _kind(name)
        report.bytes_by_kind[kind] = report.bytes_by_kind.get(kind, 0) + t.nbytes
        types = report.types_by_kind.setdefault(kind, {})
        types[t.ggml_type.name] = types.get(t.ggml_type.name, 0) + 1
    return report


def check(path: str | os.PathLike, *, config: dict[str, Any] | None = None) -> CheckReport:
    """`glm5lib map check PATH`: open the file/shard set (headers only) and check it. Raises GGUFFormatError
    (exit 2) when the file cannot be read as a glm-dsa GGUF at all."""
    from glm5lib.mapping.source import open_model

    gs = open_model(path)
    try:
        return check_set(gs, config=config, path=str(path))
    except (KeyError, TypeError, ValueError) as exc:  # metadata so broken no config can be formed
        raise GGUFFormatError(f"{path}: cannot read glm-dsa metadata: {exc}") from None
