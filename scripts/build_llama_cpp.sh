#!/usr/bin/env bash
# llama.cpp for the serving comparison (bench/harness/llama_cpp.py): the C++ `llama-server` built from the
# llama.cpp that llama-cpp-python vendors (its PyPI sdist, pinned below), and the embedded default's HF
# folder converted to a bf16 GGUF with that llama.cpp's own converter: the same weights vLLM serves.
# Everything lands under var/llama-cpp/ (ignored by git). Idempotent; ~10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
DIR=var/llama-cpp
PY=${PY:-.venv/bin/python}
mkdir -p "$DIR"
if [ ! -d "$DIR/src" ]; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR/sdist"
  tar -xzf "$DIR/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
  mv "$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DIR/src"
  rm -rf "$DIR/llama_cpp_python-$VERSION" "$DIR/sdist"
fi
if [ ! -x "$DIR/build/bin/llama-server" ]; then
  cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  cmake --build "$DIR/build" --target llama-server -j "$(nproc)"
fi
GGUF="$DIR/smollm2-135m-instruct-bf16.gguf"
if [ ! -f "$GGUF" ]; then
  PYTHONPATH="$DIR/src/gguf-py" "$PY" "$DIR/src/convert_hf_to_gguf.py" models/SmolLM2-135M-Instruct \
    --outtype bf16 --outfile "$GGUF"
fi
echo "llama.cpp ready: $DIR/build/bin/llama-server, $GGUF"
