#!/usr/bin/env bash
# Sets up the peer engines for benchmarks/compare.py: a benchmark extra, never run in CI.
#
# Why a separate venv (benchmarks/.venv-peers): onnxruntime-genai 0.18's model builder imports
# transformers 5.x classes at import time, while ortgen's export stack (optimum-onnx 0.1.0)
# caps transformers < 4.58. One environment cannot hold both, so the peers live here and
# ortgen, optimum and transformers-PyTorch run from the main venv (/work/main/.venv).
#
# Why llama-cpp-python is built from its sdist with explicit SIMD flags: a GGML_NATIVE build
# segfaults on multi-token batches on a VM that lists AMX in /proc/cpuinfo (shared NOTES), so
# we turn native detection off and enable only the features /proc/cpuinfo really lists. The
# wheel is built with --no-cache-dir because pip otherwise reuses a broken cached wheel.
#
# Idempotent: every step is skipped when its result is already there. Models are built into
# benchmarks/.models/ (git-ignored); the default model's GGUF comes from the main venv's
# `ortgen export --default` when `make model` has not run yet.
#
# GGUF files as users bring them (benchmarks/gguf.py, issue 37): the default GGUF re-quantised
# by llama.cpp's own quantiser to Q4_K_M, Q5_K_M, Q6_K, Q8_0 and Q4_0, beside the published
# Q4_1, in benchmarks/.models/gguf/ (benchmarks/gguf_files.py: an F32 GGUF written with gguf-py
# in the main venv, then llama-cpp-python's llama_model_quantize in the peers venv). This step
# runs with --no-models too (it needs llama-cpp-python, not the genai models); --no-gguf skips it.
#
# Usage: bash benchmarks/setup_peers.sh [--no-llama] [--no-models] [--no-gguf]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="$HERE/.venv-peers"
PY="$VENV/bin/python"
MAIN_PY="${ORTGEN_MAIN_PYTHON:-$ROOT/.venv/bin/python}"
MODELS="$HERE/.models"
WHEELS="$HERE/.wheels"
GGUF="$ROOT/exported_models/.cache/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_VERSION="0.3.36"
GENAI_VERSION="0.18.0"
# the newest transformers 5.x with which the 0.18 builder imports and builds the default
# model (checked by the import test below; override with PEERS_TRANSFORMERS="transformers==X")
TRANSFORMERS_SPEC="${PEERS_TRANSFORMERS:-transformers>=5,<6}"

DO_LLAMA=1
DO_MODELS=1
DO_GGUF=1
for arg in "$@"; do
  case "$arg" in
    --no-llama) DO_LLAMA=0 ;;
    --no-models) DO_MODELS=0 ;;
    --no-gguf) DO_GGUF=0 ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[setup_peers] $*"; }

# --- 1. the venv ---------------------------------------------------------------------------
if [ ! -x "$PY" ]; then
  log "creating $VENV"
  "${PEERS_BASE_PYTHON:-python3.11}" -m venv "$VENV"
fi

# --- 2. python packages (torch pinned: any other spec may pull a multi-GB CUDA build) -------
if ! "$PY" -c "import onnxruntime_genai, onnx_ir, transformers, torch, numpy, psutil" 2>/dev/null
then
  log "installing torch==2.13.0, onnxruntime-genai==$GENAI_VERSION, onnx-ir, $TRANSFORMERS_SPEC"
  "$PY" -m pip install -q "torch==2.13.0" "onnxruntime-genai==$GENAI_VERSION" onnx-ir \
    "$TRANSFORMERS_SPEC" numpy psutil
fi
if ! "$PY" -c "import onnxruntime_genai.models.builder" 2>/dev/null; then
  echo "[setup_peers] onnxruntime-genai $GENAI_VERSION's builder does not import:" >&2
  "$PY" -c "import onnxruntime_genai.models.builder" >&2 || true
  exit 1
fi

# --- 3. llama-cpp-python from its sdist, explicit SIMD flags --------------------------------
llama_flags() {
  # With GGML_NATIVE=OFF, ggml turns SSE4.2/AVX/AVX2/BMI2/FMA/F16C on by default: say ON or
  # OFF for each from /proc/cpuinfo, and ON for the AVX-512/VNNI parts only where listed.
  local flags f name
  flags="$(grep -m1 '^flags' /proc/cpuinfo)"
  local args="-DGGML_NATIVE=OFF"
  for f in sse4_2:SSE42 avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C; do
    name="${f#*:}"
    if grep -qw "${f%%:*}" <<<"$flags"; then args="$args -DGGML_$name=ON"
    else args="$args -DGGML_$name=OFF"; fi
  done
  for f in avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 \
           avx512vbmi:AVX512_VBMI avx_vnni:AVX_VNNI; do
    if grep -qw "${f%%:*}" <<<"$flags"; then args="$args -DGGML_${f#*:}=ON"; fi
  done
  # AMX is never enabled: a VM that lists it segfaulted on multi-token batches (NOTES)
  echo "$args"
}

if [ "$DO_LLAMA" = 1 ]; then
  FLAGS="$(llama_flags)"
  STAMP="$VENV/.llama-cmake-args"
  if "$PY" -c "import llama_cpp" 2>/dev/null && [ -f "$STAMP" ] && \
     [ "$(cat "$STAMP")" = "$LLAMA_VERSION $FLAGS" ]; then
    log "llama-cpp-python $LLAMA_VERSION already built with: $FLAGS"
  else
    log "building llama-cpp-python $LLAMA_VERSION from its sdist (~5-7 min) with: $FLAGS"
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/llama_cpp_python-*.whl
    # LLAVA_BUILD=OFF skips the multimodal library (a third of the build; not used here)
    CMAKE_ARGS="$FLAGS -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$PY" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
    "$PY" -m pip install --no-cache-dir --force-reinstall "$WHEELS"/llama_cpp_python-*.whl
    echo "$LLAMA_VERSION $FLAGS" > "$STAMP"
  fi
fi

# --- 4. models ------------------------------------------------------------------------------
if [ "$DO_MODELS" = 1 ]; then
  mkdir -p "$MODELS"
  if [ ! -f "$GGUF" ]; then
    log "no $GGUF yet: running ortgen export --default in the main venv"
    (cd "$ROOT" && "$ROOT/.venv/bin/ortgen" export --default)
  fi
  # llama.cpp reads the GGUF itself; a link keeps every peer model under .models/
  ln -sf "$GGUF" "$MODELS/model.Q4_1.gguf"

  HF="$MODELS/hf"
  if [ ! -f "$HF/config.json" ]; then
    log "GGUF -> transformers folder $HF (main venv)"
    "$MAIN_PY" - "$GGUF" "$HF" <<'EOF'
import sys
from pathlib import Path

try:
    from ortgen.export.gguf import gguf_to_hf_folder
except ImportError:  # the module is being moved from ortgen.gguf to ortgen.export.gguf
    from ortgen.gguf import gguf_to_hf_folder
gguf_to_hf_folder(Path(sys.argv[1]), Path(sys.argv[2]))
EOF
  fi

  # onnxruntime-genai's own builder. The builder has no context-length option; its default
  # search.max_length (8192, the model's context) sizes the shared KV buffer, so the written
  # genai_config.json gets max_length 2048 (the runner sets prompt + new tokens anyway).
  for prec in int4 fp32; do
    OUT="$MODELS/genai-$prec"
    if [ ! -f "$OUT/genai_config.json" ]; then
      log "onnxruntime-genai $GENAI_VERSION builder: $prec -> $OUT"
      rm -rf "$OUT" "$MODELS/.builder-cache-$prec"
      "$PY" -m onnxruntime_genai.models.builder -i "$HF" -o "$OUT" -p "$prec" -e cpu \
        -c "$MODELS/.builder-cache-$prec" --search '{"max_length": 2048}'
      rm -rf "$MODELS/.builder-cache-$prec"
    fi
  done
fi

# --- 5. GGUF files re-quantised by llama.cpp (benchmarks/gguf.py) ---------------------------
if [ "$DO_GGUF" = 1 ]; then
  if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    log "skipping the GGUF files: llama-cpp-python is not built (run without --no-llama)"
  else
    GGUF_DIR="$MODELS/gguf"
    mkdir -p "$GGUF_DIR"
    if [ ! -f "$GGUF" ]; then
      log "no $GGUF yet: downloading the default GGUF (main venv)"
      "$MAIN_PY" -c "import sys; from ortgen.gguf.default_model import download_default_gguf; \
download_default_gguf(sys.argv[1])" "$(dirname "$GGUF")"
    fi
    ln -sf "$GGUF" "$GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
    F32="$GGUF_DIR/SmolLM2-135M-Instruct.F32.gguf"
    for kind in Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0; do
      OUT="$GGUF_DIR/SmolLM2-135M-Instruct.$kind.gguf"
      [ -f "$OUT" ] && continue
      if [ ! -f "$F32" ]; then
        log "writing $F32 (every tensor dequantised, main venv)"
        "$MAIN_PY" "$HERE/gguf_files.py" f32 "$GGUF" "$F32"
      fi
      log "llama.cpp quantiser: $kind -> $OUT (its log: $OUT.log)"
      if ! "$PY" "$HERE/gguf_files.py" quantize "$F32" "$OUT" "$kind" >"$OUT.log" 2>&1; then
        tail -5 "$OUT.log" >&2
        exit 1
      fi
    done
    rm -f "$F32"  # 540 MB, only the quantiser's input
    log "GGUF files in $GGUF_DIR: $(cd "$GGUF_DIR" && ls ./*.gguf | tr '\n' ' ')"
  fi
fi

log "done: $VENV (models in $MODELS; compare.py makes the optimum fp32 folder on first use)"
