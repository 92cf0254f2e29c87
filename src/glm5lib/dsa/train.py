"""Give the tiny GLM-5 attention worth analysing: a short deterministic CPU training run.

Random weights attend almost uniformly, so "which keys does the indexer keep" means nothing on them. Two stages,
following the DeepSeek-V3.2 recipe at toy scale:

1. Dense warm-up of the whole model on key-value recall (`recall_batch`): a stream of "pair" tokens (key k
   holds value v, every key stored once) with queries mixed in; after a query the model must produce the
   value of a key stored anywhere earlier, so it needs attention beyond any local window (and beyond top-k
   once rows are longer than 64). Trained through transformers' `GlmMoeDsaForCausalLM` (batched) with
   `index_topk` raised above the row length, so attention is dense while the indexer is still random; short
   rows first (the content match is found quickly among a few dozen keys), then rows of 192.
2. Indexer warm-up: everything else frozen, each layer's lightning indexer is trained to match the head-summed,
   L1-normalised dense attention of its layer, loss = KL(p_attn || softmax(index scores)) over the causal keys
   (DeepSeek-V3.2 section 2.1.1, "dense warm-up stage"). Trunk activations are computed once by the reference
   and reused, so this stage costs little.

`ensure_trained_tiny()` caches the result as a full tiny build (HF dir + GGUF) in `.cache/tiny-trained`; the
weights (~40 MB fp32) are not shipped, this recipe rebuilds them bit for bit on the same torch build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from glm5lib.model.reference import LATENT_NORM_EPS, DSAOptions, ReferenceModel, Trace, rms_norm
from glm5lib.model.rope import rope_cos_sin
from glm5lib.model.spec import GLM5Config
from glm5lib.errors import UserError
from glm5lib.mapping.tiny import TinyPaths, build_tiny, default_cache_dir, init_weights, load_tiny, write_hf_dir
from glm5lib.progress import show_progress

INDEXER_PREFIX = "self_attn.indexer."


@dataclass(frozen=True)
class TrainRecipe:
    seed: int = 0
    seq_len: int = 192  # rows for the last phase and the indexer warm-up (> index_topk)
    # (steps, sequence length, batch) per phase: short rows first, where attending to the one right key out of
    # a few dozen is found quickly; the learned content match then carries over to long rows
    phases: tuple[tuple[int, int, int], ...] = ((200, 48, 8), (50, 192, 4))
    keys: int = 96  # distinct keys (each stored once per row, so retrieval distance is spread over the row)
    values: int = 4
    first_id: int = 64  # task tokens start here (the tokenizer's specials sit below)
    warmup_pairs: int = 4
    query_rate: float = 0.5
    factorized_embeddings: bool = True  # start task-token embeddings as key part + value part (see below)
    lr: float = 2e-3
    indexer_seqs: int = 24
    indexer_steps: int = 300
    indexer_lr: float = 3e-3
    version: int = 1

    @property
    def steps(self) -> int:
        return sum(p[0] for p in self.phases)

    def schedule(self):
        """(sequence length, batch) for every step."""
        for steps, seq_len, batch in self.phases:
            for _ in range(steps):
                yield seq_len, batch

    def key(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def recall_batch(gen: torch.Generator, batch: int, seq_len: int, recipe: "TrainRecipe"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-value recall: (ids [B, T], predictable [B, T] bool: the token at t can be inferred from ids[:t]).

    A row is a stream of "pair" tokens (key k holding value v, one token each, every key at most once) with
    queries mixed in after the first `recipe.warmup_pairs` tokens: a query token names a key seen earlier and the
    next token is the answer token of its value. Answering needs one attention hop to a pair that can be anywhere
    in the context (so beyond any local window), which small models learn quickly."""
    K, V = recipe.keys, recipe.values
    pair0, query0, answer0 = recipe.first_id, recipe.first_id + K * V, recipe.first_id + K * V + K
    ids = torch.empty(batch, seq_len, dtype=torch.long)
    mask = torch.zeros(batch, seq_len, dtype=torch.bool)
    for b in range(batch):
        keys = torch.randperm(K, generator=gen).tolist()
        values = torch.randint(0, V, (K,), generator=gen).tolist()
        seen: list[int] = []
        t = 0
        while t < seq_len:
            ask = t >= recipe.warmup_pairs and t + 1 < seq_len and bool(
                torch.rand((), generator=gen) < recipe.query_rate)
            if (ask or not keys) and seen:
                k = seen[int(torch.randint(0, len(seen), (1,), generator=gen))]
                ids[b, t], ids[b, t + 1] = query0 + k, answer0 + values[k]
                mask[b, t + 1] = True
                t += 2
            else:
                k = keys.pop()
                seen.append(k)
                ids[b, t] = pair0 + k * V + values[k]
                t += 1
    return ids, mask


def _hf_model(cfg: GLM5Config, weights: dict[str, torch.Tensor], work: Path, dense_topk: int):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    write_hf_dir(cfg, weights, work)
    logging.set_verbosity_error()  # the tiny MTP layer is reported "unexpected" (transformers skips layer 78 only)
    return AutoModelForCausalLM.from_pretrained(work, attn_implementation="eager", dtype=torch.float32,
                                                index_topk=dense_topk)


def _hf_to_checkpoint(model, cfg: GLM5Config, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused expert tensors back to checkpoint names (per-expert gate/up/down)."""
    out = dict(base)  # MTP layer and anything transformers does not hold keep their values
    I = cfg.moe_intermediate_size
    for name, t in model.state_dict().items():
        t = t.detach().clone().float()
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = t[e, I:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            if name not in out:
                raise KeyError(f"transformers tensor {name} has no checkpoint counterpart")
            out[name] = t
    return out


def initial_weights(cfg: GLM5Config, recipe: TrainRecipe) -> dict[str, torch.Tensor]:
    """`init_weights`, with the task tokens' embeddings factorised when the recipe asks for it.

    A pretrained LM already knows its vocabulary; the toy does not, and learning 600+ token embeddings from
    scratch eats most of a few-hundred-step CPU budget. So pair(k, v) starts as key(k) + value(v), query(k) as
    key(k) + a query marker, and answer(v)'s input and output rows as value(v): only the attention (what the
    analysis is about) and the MLPs have to be learned."""
    weights = init_weights(cfg, recipe.seed)
    if not recipe.factorized_embeddings:
        return weights
    K, V, D = recipe.keys, recipe.values, cfg.hidden_size
    gen = torch.Generator().manual_seed(recipe.seed + 3)
    key, value, marker = (torch.randn(n, D, generator=gen) * 0.02 for n in (K, V, 1))
    emb, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    pair0, query0, answer0 = recipe.first_id, recipe.first_id + K * V, recipe.first_id + K * V + K
    emb[pair0: pair0 + K * V] = (key[:, None, :] + value[None, :, :]).reshape(K * V, D)
    emb[query0: query0 + K] = key + marker
    emb[answer0: answer0 + V] = value
    head[answer0: answer0 + V] = value / value.norm(dim=-1, keepdim=True)
    return weights


def train_dense(cfg: GLM5Config, recipe: TrainRecipe, *, progress: bool = True) -> tuple[dict, list[float]]:
    """Stage 1. Returns (HF-named weights, loss per step)."""
    torch.manual_seed(recipe.seed)
    weights = initial_weights(cfg, recipe)
    with tempfile.TemporaryDirectory() as tmp:
        model = _hf_model(cfg, weights, Path(tmp) / "hf", dense_topk=max([p[1] for p in recipe.phases] + [cfg.index_topk]))
    model.train()
    params = [p for n, p in model.named_parameters() if ".indexer." not in n]
    for n, p in model.named_parameters():
        p.requires_grad_(".indexer." not in n)
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0, betas=(0.9, 0.95))
    warm = max(recipe.steps // 10, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s / recipe.steps, 1.0))))
    gen = torch.Generator().manual_seed(recipe.seed + 1)
    losses: list[float] = []
    bar = tqdm(list(recipe.schedule()), desc="train (dense)", disable=not show_progress(progress))
    for seq_len, batch in bar:
        ids, mask = recall_batch(gen, batch, seq_len, recipe)
        labels = ids.masked_fill(~mask, -100)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return _hf_to_checkpoint(model, cfg, weights), losses


def distill_indexer(cfg: GLM5Config, weights: dict[str, torch.Tensor], recipe: TrainRecipe, *,
                    progress: bool = True) -> tuple[dict, list[float]]:
    """Stage 2: fit every layer's indexer to its layer's head-summed dense attention (KL). Returns (weights, loss
    per step summed over layers)."""
    weights = {k: v.detach().clone() for k, v in weights.items()}
    ref = ReferenceModel(cfg, weights, stream=True)  # stream: w[...] hands back the dict's own tensors
    gen = torch.Generator().manual_seed(recipe.seed + 2)
    ids, _ = recall_batch(gen, recipe.indexer_seqs, recipe.seq_len, recipe)
    T = recipe.seq_len
    pos = torch.arange(T)
    cos, sin = rope_cos_sin(pos, cfg.qk_rope_head_dim, cfg.rope_theta)
    allowed = torch.arange(T)[None, :] <= pos[:, None]
    layers = [i for i in range(cfg.num_hidden_layers) if cfg.has_indexer(i)]
    data: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {i: [] for i in layers}
    with torch.no_grad():
        for row in ids:
            tr = Trace(("hidden", "attn_probs"))
            ref.forward(row, options=DSAOptions(dense=True), trace=tr)
            for i in layers:
                w = ref.layer_weights(i)
                x = rms_norm(tr.layers[i]["hidden"], w["input_layernorm.weight"], cfg.rms_norm_eps)
                q_resid = rms_norm(x @ w["self_attn.q_a_proj.weight"].T, w["self_attn.q_a_layernorm.weight"],
                                   LATENT_NORM_EPS)
                target = tr.layers[i]["attn_probs"].sum(0)
                target = target / target.sum(-1, keepdim=True)  # head-summed, L1-normalised
                data[i].append((x, q_resid, target))
    trainable = {k: v.requires_grad_(True) for k, v in weights.items() if INDEXER_PREFIX in k}
    opt = torch.optim.Adam(list(trainable.values()), lr=recipe.indexer_lr)
    losses: list[float] = []
    bar = tqdm(range(recipe.indexer_steps), desc="indexer warm-up (KL)", disable=not show_progress(progress))
    for step in bar:
        total = 0.0
        opt.zero_grad(set_to_none=True)
        n = len(ids)
        for j in (step * 4 + k for k in range(4)):  # 4 sequences a step
            for i in layers:
                x, q_resid, target = data[i][j % n]
                scores = ref.indexer(ref.layer_weights(i), x, q_resid, cos, sin, i, None, DSAOptions())
                logq = torch.log_softmax(scores.masked_fill(~allowed, float("-inf")), -1)
                # KL(p || q) = sum p log p - sum p log q; the first term is constant
                plogp = torch.xlogy(target, target).sum(-1)
                kl = (plogp - (target * logq.masked_fill(~allowed, 0.0)).sum(-1)).mean()
                (kl / 4).backward()
                total += float(kl.detach()) / 4
        opt.step()
        losses.append(total)
        bar.set_postfix(kl=f"{total:.3f}")
    return {k: v.detach() for k, v in weights.items()}, losses


def train_tiny(recipe: TrainRecipe | None = None, cfg: GLM5Config | None = None, *,
               progress: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """Both stages, deterministic on one core. Returns (HF-named weights, log)."""
    recipe = recipe or TrainRecipe()
    cfg = cfg or GLM5Config.tiny()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine is shared; one core also keeps reductions in a fixed order
    try:
        t0 = time.perf_counter()
        weights, losses = train_dense(cfg, recipe, progress=progress)
        t1 = time.perf_counter()
        weights, kl = distill_indexer(cfg, weights, recipe, progress=progress)
        t2 = time.perf_counter()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(was_deterministic)
    log = {"recipe": dataclasses.asdict(recipe), "loss": losses, "indexer_kl": kl,
           "seconds_dense": t1 - t0, "seconds_indexer": t2 - t1}
    return weights, log


def ensure_trained_tiny(root: Path | None = None, recipe: TrainRecipe | None = None, *,
                        types: tuple[str, ...] = ("F32", "Q8_0"), progress: bool = True) -> TinyPaths:
    """The trained tiny model (HF dir + GGUF), trained and cached on first use (a few minutes on one core)."""
    recipe = recipe or TrainRecipe()
    root = Path(root) if root else default_cache_dir() / "tiny-trained"
    stamp = root / "train_log.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == recipe.key():
        return load_tiny(root)
    if root.exists():
        if not (stamp.exists() or (root / "manifest.json").exists()):
            raise UserError(f"{root} exists and is not a trained tiny-model directory; choose another --out")
        shutil.rmtree(root)  # our own build, stale recipe (or interrupted before its stamp)
    weights, log = train_tiny(recipe, progress=progress)
    paths = build_tiny(root, weights=weights, types=types, progress=progress)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": recipe.key(), **log}))
    tmp.replace(stamp)
    return paths


def train_log(paths: TinyPaths) -> dict:
    return json.loads((paths.root / "train_log.json").read_text())


def task_sequences(n: int, seq_len: int, recipe: TrainRecipe | None = None, seed: int = 1000
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` evaluation rows of the training task (a seed the training never used): [(ids [T], predictable [T])]."""
    recipe = recipe or TrainRecipe()
    ids, mask = recall_batch(torch.Generator().manual_seed(seed), n, seq_len, recipe)
    return list(zip(ids, mask))


def task_accuracy(model: ReferenceModel, rows, options: DSAOptions | None = None) -> float:
    """Fraction of answer tokens the model predicts (argmax) from what precedes them."""
    hit = total = 0
    with torch.no_grad():
        for ids, mask in rows:
            pred = model.forward(ids, options=options).argmax(-1)
            m = mask[1:]
            hit += int((pred[:-1][m] == ids[1:][m]).sum())
            total += int(m.sum())
    return hit / max(total, 1)
