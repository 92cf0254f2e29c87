"""HF tokenizer files from a GGUF's `tokenizer.ggml.*` metadata.

The conversion itself is transformers' (`transformers.integrations.gguf.gguf_tokenizer_mapping`: the
byte-level BPE builder for `tokenizer.ggml.model = gpt2`, control tokens added as special tokens). This module
only feeds it from our header reader (so a 400 GB shard set is not touched beyond its metadata) and writes
`tokenizer.json` + `tokenizer_config.json` with the chat template and special tokens from the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from glm5lib.errors import UserError

# GGUF key -> the name transformers' builder expects (its GGUF_TOKENIZER_MAPPING["tokenizer"]).
_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _tokenizer_dict(kv: dict[str, Any]) -> dict[str, Any]:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    return {name: kv[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
            if f"tokenizer.{key}" in kv}


def build_fast_tokenizer(kv: dict[str, Any]):
    """A `PreTrainedTokenizerFast` built by transformers' GGUF converter from the metadata `kv`."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    if "tokenizer.ggml.tokens" not in kv:
        raise UserError("the GGUF has no tokenizer.ggml.tokens: no tokenizer to rebuild")
    td = _tokenizer_dict(kv)
    tokens = td["tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise UserError("the GGUF's tokenizer.ggml.tokens is not an array of strings")
    for key in _SPECIAL_IDS.values():
        tid = kv.get(key)
        if tid is not None and not (isinstance(tid, int) and 0 <= tid < len(tokens)):
            raise UserError(f"the GGUF's {key} is {tid!r}, not a token id (0..{len(tokens) - 1})")
    try:
        backend, _ = convert_gguf_tokenizer(kv.get("general.architecture", ""), td)
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # metadata transformers' builder cannot use
        raise UserError(f"transformers cannot rebuild this tokenizer: {type(exc).__name__}: {exc}") from None
    special = {name: tokens[kv[key]] for name, key in _SPECIAL_IDS.items() if kv.get(key) is not None}
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    if "tokenizer.chat_template" in kv:
        fast.chat_template = kv["tokenizer.chat_template"]
    return fast


def gguf_to_hf_tokenizer(path: str | os.PathLike | Any, out_dir: str | os.PathLike) -> Path:
    """Write `tokenizer.json` and `tokenizer_config.json` (with `chat_template`) for the GGUF at `path` into
    `out_dir` (created if needed; existing tokenizer files are not overwritten). Returns `out_dir`.

    `path` may be any shard of a set, or an already opened GGUF set.
    """
    from glm5lib.mapping.source import open_model

    gs = open_model(path) if isinstance(path, (str, os.PathLike)) else path
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (out / name).exists():
            raise UserError(f"{out / name} already exists; refusing to overwrite")
    try:
        fast = build_fast_tokenizer(gs.kv)
    except UserError as exc:  # name the file: the message only knows the metadata
        raise UserError(f"{gs.shards[0]}: {exc}") from None
    # save_pretrained writes several files; write to a temp dir and move the two we promise.
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        fast.save_pretrained(tmp)
        cfg_path = Path(tmp) / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        if fast.chat_template and "chat_template" not in cfg:  # older transformers write chat_template.jinja
            cfg["chat_template"] = fast.chat_template
            cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            os.replace(Path(tmp) / name, out / name)
    return out
