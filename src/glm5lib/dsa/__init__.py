"""DeepSeek Sparse Attention in GLM-5: the indexer, what it keeps, what it costs.

Modules (import the one you need; nothing heavy is imported here):
- `indexer`   the lightning indexer in plain fp32 (scores, top-k with defined tie-breaking, fp8 + Hadamard codec)
- `analysis`  attention-mass recall, dense vs sparse, RoPE layout check/detection/conversion, fp8, IndexShare
- `cost`      indexer vs sparse-attention FLOPs and bytes per token at GLM-5 shapes (the ~35K crossover)
- `train`     the trained tiny model (key-value recall + indexer KL warm-up), cached in .cache/tiny-trained
- `footprint` layer-by-layer runs from a GGUF: time and peak memory; synthetic full-size layers
- `plots`     figures for notebook 03
- `cli`       `glm5lib dsa train-tiny | analyze | cost | rope-layout`

The model itself is `glm5lib.model.reference.ReferenceModel`.
"""
