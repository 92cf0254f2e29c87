"""The tiny model's tokenizer: a real byte-level BPE trained with `tokenizers` on text the package ships.

GLM-5 ships a gpt2-style BPE (`tokenizer.ggml.model = gpt2` in GGUF); the tiny one is built the same way,
with GLM's chat special tokens, so tokenizer conversion and chat templates are exercised for real.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

EOS_TOKEN = "<|endoftext|>"
# GLM-4/5 chat special tokens (subset), ids 0.. in this order.
SPECIAL_TOKENS = (
    EOS_TOKEN, "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
)
# GLM-style chat template: "[gMASK]<sop><|user|>\n...<|assistant|>\n".
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus_text() -> str:
    return resources.files("glm5lib.data").joinpath("corpus.txt").read_text(encoding="utf-8")


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """Deterministic: BPE training on a fixed corpus with fixed settings gives the same merges every time."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus_text()
    lines = [line for line in text.splitlines() if line.strip()]
    tok.train_from_iterator(lines, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:  # corpus too small for the requested vocabulary
        raise ValueError(f"tokenizer trained to {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def save_hf_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json as transformers' PreTrainedTokenizerFast expects."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
