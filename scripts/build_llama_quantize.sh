#!/usr/bin/env bash
# Build llama.cpp's `llama-quantize` (makes the tiny model's K-quant fixtures, e.g. Q4_K_M, with llama.cpp's own
# per-tensor type choices) from the llama.cpp source vendored in the llama-cpp-python sdist
# (scripts/build_llama_tool.sh: same download and build tree as llama-gguf-split, so ggml is compiled once).
# Prints the binary path on the last line.
#
#   scripts/build_llama_quantize.sh              # -> .cache/llama.cpp/build/bin/llama-quantize
#   JOBS=8 scripts/build_llama_quantize.sh
exec "$(dirname "$0")/build_llama_tool.sh" llama-quantize
