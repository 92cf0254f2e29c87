#!/usr/bin/env bash
# Build llama.cpp's `llama-gguf-split` (the byte-exact reference for `glm5lib gguf split|merge`) from the llama.cpp
# source vendored in the llama-cpp-python sdist (scripts/build_llama_tool.sh: shared download and build tree).
# Prints the binary path on the last line.
#
#   scripts/build_llama_gguf_split.sh            # -> .cache/llama.cpp/build/bin/llama-gguf-split
#   JOBS=8 scripts/build_llama_gguf_split.sh
exec "$(dirname "$0")/build_llama_tool.sh" llama-gguf-split
