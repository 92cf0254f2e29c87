"""GLM-5 itself (floor 2): what is true of the model whatever file it came from and whatever runs it.

Modules: `spec` (config fields, every HF and GGUF tensor name, shape and storage type: the one source of GLM-5
names and sizes), `layout` (kv_b transforms between HF and GGUF tensors), `rope`, `indexer` (the DSA lightning
indexer math and its fp8 key codec), `reference` (the fp32 reference forward over any weight source),
`metrics` (how far apart two tensors are), `tokenizer` (the tiny model's BPE).

A change goes here when it is about the model's math or names. Reading GGUF containers belongs in
`glm5lib.gguf`, converting GGUF <-> HF in `glm5lib.mapping`, GPU kernels in `glm5lib.kernels`, measurements
built on the reference in `glm5lib.dsa`.
"""
