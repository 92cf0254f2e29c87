"""DeepSeek Sparse Attention in GLM-5 (floor 4): what the indexer keeps and what it costs, measured.

Modules (import the one you need; nothing heavy is imported here):
- `analysis`  attention-mass recall, dense vs sparse, RoPE layout check/detection/conversion, fp8, IndexShare
- `cost`      indexer vs sparse-attention FLOPs and bytes per token at GLM-5 shapes (the ~35K crossover)
- `train`     the trained tiny model (key-value recall + indexer KL warm-up), cached in .cache/tiny-trained
- `footprint` layer-by-layer runs from a GGUF: time and peak memory; synthetic full-size layers
- `plots`     figures for notebook 03
- `cli`       `glm5lib dsa train-tiny | analyze | cost | rope-layout`

A change goes here when it measures or trains on the model. The indexer math itself is
`glm5lib.model.indexer`, the model `glm5lib.model.reference.ReferenceModel`, the Triton indexer
`glm5lib.kernels.indexer`.
"""
