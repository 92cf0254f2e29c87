"""GPU measurements: benchmarks and op harnesses that produce the evidence under `outputs/bench/`.

They run on a CUDA machine without vLLM and print every target beside its measured ratio. Nothing in the
plugin vLLM loads imports this package.
"""
