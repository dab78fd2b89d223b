#!/usr/bin/env bash
# GPU benchmark (headedit bench gpu): the single-head screen of a random-weight model at SmolLM3-3B's real
# shapes (full depth: 36 layers x 16 heads, 4 KV heads, hidden 2048, vocab 128,256; built from the real
# config.json, no weights downloaded), bfloat16, SDPA attention, on the arithmetic task in the
# smollm3-arithmetic recipe's chat format. Every head ablated alone plus intact (577 sets) on 128 examples
# through the fast engine (batch size probed by headedit.engine.autobatch), and the naive loop (one generate per
# example per set) on 3 of those sets x 16 examples. Prints examples/s, executed TFLOP/s (FLOPs counted
# by hooks on every decoder layer and the LM head) and the fast/naive ratio per set-example; exits 1 if
# the two paths disagree. Sized to finish in well under 4 minutes on one H200 (estimate; not yet measured).
#
# Usage: scripts/gpu_bench.sh [extra `headedit bench gpu` options, e.g. --json or --n 256]
#   HEADEDIT_DATA_DIR  folder of the real data (default ../shared/data/hf); the config is read from
#                      $HEADEDIT_DATA_DIR/../tokenizers/SmolLM3-3B/config.json, or pass --config PATH.
#   PYTHON             interpreter (default .venv/bin/python when present, else python3)
# CPU smoke test of the same code (seconds): scripts/gpu_bench.sh --tiny
set -euo pipefail
cd "$(dirname "$0")/.."
export HEADEDIT_DATA_DIR="${HEADEDIT_DATA_DIR:-$(cd .. && pwd)/shared/data/hf}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" -m headedit bench gpu --n 128 --naive-sets 3 --naive-n 16 --dtype bfloat16 "$@"
