#!/usr/bin/env bash
# Build llama.cpp's `llama-gguf-split` (the byte-exact reference for `glm5lib gguf split|merge`) from the
# llama.cpp source vendored in the PyPI sdist of llama-cpp-python, into .cache/llama.cpp/.
# Only that one target (and the libraries it links: ggml, llama, llama-common) is built, CPU only, no curl/ssl.
# Prints the binary path on the last line. Re-running reuses the download and the build tree.
#
#   scripts/build_llama_gguf_split.sh            # -> .cache/llama.cpp/build/bin/llama-gguf-split
#   JOBS=8 scripts/build_llama_gguf_split.sh
set -euo pipefail

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
BIN="$BUILD/bin/llama-gguf-split"

if [ ! -f "$SDIST" ]; then
    echo "downloading llama-cpp-python==$VERSION sdist" >&2
    # pip prepares the sdist's metadata (fetching scikit-build-core into an isolated env); nothing is installed
    $PIP download --no-deps --no-binary :all: -d "$CACHE" "llama-cpp-python==$VERSION" >&2
fi
if [ ! -f "$SRC/tools/gguf-split/gguf-split.cpp" ]; then
    rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
    # only the vendored llama.cpp tree is needed
    tar xzf "$SDIST" -C "$SRC.tmp" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
    [ -f "$SRC.tmp/tools/gguf-split/gguf-split.cpp" ] || { echo "error: sdist has no tools/gguf-split/gguf-split.cpp" >&2; exit 1; }
    rm -rf "$SRC" && mv "$SRC.tmp" "$SRC"
fi

start=$(date +%s)
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON >&2
cmake --build "$BUILD" --target llama-gguf-split -j "$JOBS" >&2
echo "built llama-gguf-split in $(( $(date +%s) - start )) s" >&2
[ -x "$BIN" ] || { echo "error: build finished but $BIN is missing" >&2; exit 1; }
echo "$BIN"
