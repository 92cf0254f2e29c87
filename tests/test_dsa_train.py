"""The tiny-model training recipe: task invariants, the transformers <-> checkpoint round trip, determinism."""

import tempfile
from pathlib import Path

import pytest
import torch

from glm5lib.dsa import train
from glm5lib.model.reference import ReferenceModel
from glm5lib.model.spec import GLM5Config


def test_recall_batch_answers_are_recoverable():
    r = train.TrainRecipe()
    ids, mask = train.recall_batch(torch.Generator().manual_seed(0), 4, 192, r)
    K, V = r.keys, r.values
    pair0, query0, answer0 = r.first_id, r.first_id + K * V, r.first_id + K * V + K
    for row, m in zip(ids.tolist(), mask.tolist()):
        stored = {}
        for t, tok in enumerate(row):
            if pair0 <= tok < query0:
                k, v = divmod(tok - pair0, V)
                assert k not in stored  # every key stored once
                stored[k] = v
            if m[t]:  # an answer: the previous token asks a key stored earlier
                k = row[t - 1] - query0
                assert 0 <= k < K and tok == answer0 + stored[k]
        assert sum(m) > 40
    again, _ = train.recall_batch(torch.Generator().manual_seed(0), 4, 192, r)
    assert torch.equal(ids, again)


def test_transformers_roundtrip_keeps_the_model():
    cfg = GLM5Config.tiny()
    r = train.TrainRecipe()
    weights = train.initial_weights(cfg, r)
    with tempfile.TemporaryDirectory() as tmp:
        model = train._hf_model(cfg, weights, Path(tmp) / "hf", dense_topk=cfg.index_topk)
    back = train._hf_to_checkpoint(model, cfg, weights)
    assert back.keys() == weights.keys()
    assert all(torch.equal(back[k], weights[k]) for k in weights)
    ids = torch.randint(0, 1024, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids[None]).logits[0] - ReferenceModel(cfg, back).forward(ids)).abs().max() <= 1e-4


@pytest.mark.slow  # trains (a shortened recipe, twice)
def test_training_is_deterministic():
    torch.set_num_threads(1)
    r = train.TrainRecipe(phases=((2, 48, 2), (1, 96, 1)), indexer_seqs=2, indexer_steps=2)
    w1, log1 = train.train_tiny(r, progress=False)
    w2, log2 = train.train_tiny(r, progress=False)
    assert log1["loss"] == log2["loss"] and log1["indexer_kl"] == log2["indexer_kl"]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    changed = [k for k in w1 if ".indexer." in k and not torch.equal(w1[k], train.initial_weights(GLM5Config.tiny(), r)[k])]
    assert changed  # the indexer warm-up moved the indexer weights
