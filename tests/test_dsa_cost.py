"""The DSA cost model against docs/glm5.md numbers (computed by hand there) and against brute-force sums."""

import numpy as np
import pytest

from glm5lib.dsa import cost
from glm5lib.model.spec import GLM5Config


def test_docs_glm5_numbers():
    s = cost.CostShapes.from_config(GLM5Config.glm5())
    assert s == cost.CostShapes()
    # 2 * 64 * 2048 * (576 + 512) = 285 MFLOP per token per layer
    assert cost.sparse_attention_flops(100_000, s) == 2 * 64 * 2048 * 1088
    assert round(float(cost.sparse_attention_flops(100_000, s)) / 1e6) == 285
    # gathered KV: 2048 x 1152 B = 2.36 MB (bf16), 2048 x 656 B = 1.34 MB (fp8_ds_mla)
    assert round(float(cost.gathered_kv_bytes(10**6, s, "bf16")) / 1e6, 2) == 2.36
    assert round(float(cost.gathered_kv_bytes(10**6, s, "fp8_ds_mla")) / 1e6, 2) == 1.34
    # the ~35K crossover
    x = cost.flops_crossover(s)
    assert 34_000 < x < 36_000
    assert cost.indexer_flops(x - 1000, s) < cost.sparse_attention_flops(x - 1000, s)
    assert cost.indexer_flops(x + 1000, s) > cost.sparse_attention_flops(x + 1000, s)
    # 8 heads per GPU: FLOPs 8x smaller, bytes the same
    s8 = cost.CostShapes.from_config(GLM5Config.glm5(), heads=8)
    assert cost.sparse_attention_flops(5000, s8) * 8 == cost.sparse_attention_flops(5000, s)
    assert cost.gathered_kv_bytes(5000, s8) == cost.gathered_kv_bytes(5000, s)


@pytest.mark.parametrize("n", [1, 7, 64, 65, 300])
def test_prefill_is_sum_of_decode_costs(n):
    s = cost.CostShapes(heads=4, topk=64, index_heads=4)
    t = np.arange(1, n + 1)
    got = cost.prefill_flops(n, s)
    assert np.isclose(got["indexer"], cost.indexer_flops(t, s).sum())
    assert np.isclose(got["sparse_attention"], cost.sparse_attention_flops(t, s).sum())
    assert np.isclose(got["dense_attention"], cost.dense_attention_flops(t, s).sum())


def test_dense_equals_sparse_below_topk():
    s = cost.CostShapes()
    L = np.array([1, 100, 2048])
    assert np.array_equal(cost.sparse_attention_flops(L, s), cost.dense_attention_flops(L, s))
    assert cost.bytes_crossover(s) == 2048 * 656 / 132


def test_tensor_parallel_keeps_the_whole_indexer():
    s8 = cost.CostShapes.from_config(GLM5Config.glm5(), heads=8)
    assert s8.index_heads == 32  # replicated on every rank in vLLM
    assert np.isclose(cost.flops_crossover(s8) * 8, cost.flops_crossover(cost.CostShapes()))
