#!/usr/bin/env bash
# Build one llama.cpp tool (llama-gguf-split, llama-quantize, ...) from the llama.cpp source vendored in the PyPI
# sdist of llama-cpp-python, into .cache/llama.cpp/build/bin/. Every tool shares one download, one source tree and
# one build tree, so ggml and libllama are compiled once for all of them. Only the named target (and the libraries
# it links) is built: CPU only, Release, no curl/ssl/OpenMP. Prints the binary path on the last line.
# Re-running reuses the download and the build tree.
#
#   scripts/build_llama_tool.sh llama-quantize       # -> .cache/llama.cpp/build/bin/llama-quantize
#   JOBS=8 scripts/build_llama_tool.sh llama-gguf-split
set -euo pipefail

TARGET="${1:?usage: build_llama_tool.sh TARGET}"
# 0.3.36 vendors a llama.cpp that knows the glm-dsa architecture (src/llama-arch.cpp), which llama-quantize
# needs to load a GLM-5 file; the golden digests of tests/golden/gguf_split.txt come from its llama-gguf-split.
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${GLM5LIB_LLAMA_CACHE:-$ROOT/.cache/llama.cpp}"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
[ -x "$PIP" ] || PIP="python3 -m pip"

mkdir -p "$CACHE"
SDIST="$CACHE/llama_cpp_python-$VERSION.tar.gz"
SRC="$CACHE/src-$VERSION"
BUILD="$CACHE/build"
BIN="$BUILD/bin/$TARGET"

if [ ! -f "$SDIST" ]; then
    echo "downloading llama-cpp-python==$VERSION sdist" >&2
    # pip prepares the sdist's metadata (fetching scikit-build-core into an isolated env); nothing is installed
    $PIP download --no-deps --no-binary :all: -d "$CACHE" "llama-cpp-python==$VERSION" >&2
fi
if [ ! -f "$SRC/src/llama-arch.cpp" ]; then
    rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
    # only the vendored llama.cpp tree is needed
    tar xzf "$SDIST" -C "$SRC.tmp" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
    [ -f "$SRC.tmp/src/llama-arch.cpp" ] || { echo "error: $SDIST has no vendor/llama.cpp/src/llama-arch.cpp" >&2; exit 1; }
    rm -rf "$SRC" && mv "$SRC.tmp" "$SRC"
fi

start=$(date +%s)
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON >&2
cmake --build "$BUILD" --target "$TARGET" -j "$JOBS" >&2
echo "built $TARGET in $(( $(date +%s) - start )) s" >&2
[ -x "$BIN" ] || { echo "error: build finished but $BIN is missing" >&2; exit 1; }
echo "$BIN"
