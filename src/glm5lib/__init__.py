"""glm5lib: the GLM-5 deployment workbench (GGUF tools, weight mapping, DSA analysis, Triton kernels, vLLM plugin)."""

__version__ = "0.1.0"
