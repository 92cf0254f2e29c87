"""GPU op benchmarks that run without vLLM (`python -m glm5lib.bench.gguf_ops --out DIR`)."""
