#!/usr/bin/env bash
# Every GPU row of issue 37 on a lent GPU machine that reaches no network, in two calls made back to back: a call
# carries at most 64 MiB, so the SmolLM2 GGUF (98 MB) travels in two halves, and the wheels with the first.
#
#   bench/gpu_lease.sh prepare      here: .whl/ (wheels), .lease/part1/ (half the GGUF, nanoGPT's files at a pinned
#                                   commit, the Shakespeare text), .lease/part2/ (the other half); both ignored by git
#   bash bench/gpu_lease.sh part1   there, carry .lease/part1/nanogpt .lease/part1/shakespeare.txt.gz (or .whl
#                                   .lease/part1 when part2 follows): the training step against nanoGPT's model
#                                   and the trainer's own, CUDA tests, pretrain vs train.py, decoding
#   bash bench/gpu_lease.sh part2   there, right after, carry .lease/part2: engine step, serve start-up and table
#   bash bench/gpu_lease.sh decode  there, carry nothing: the decoding rows of part1, the SmolLM2-shaped step
#                                   (recorded vs compiled) and the graph runner's CUDA tests (~3.5 minutes)
#   bench/gpu_lease.sh smoke        here: every row at tiny shapes (or a short load) on the CPU
#
# Rows go to $OUT/rows.jsonl as each finishes (a stop keeps those written); each part prints them at its end.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/lease}
mkdir -p "$OUT"
ROWS=$OUT/rows.jsonl
PY=${PYTHON:-python3}
LEASE=${LEASE:-/tmp/lmforge-lease}
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NANOGPT=3adf61e154c3fe3fca428ad6bc3818b27a3b8291
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export LMFORGE_CACHE=$LEASE/cache PYTHONPATH=$PWD/src:$LEASE/site

row() {  # row SECONDS NAME COMMAND...: run one row under a time limit, its output in the part's log
  local limit=$1 name=$2; shift 2
  echo "== $name ($(date +%T), limit ${limit}s)" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "{\"row\": \"$name\", \"error\": \"exit $rc (124: over ${limit}s); see the log\"}" >>"$ROWS"
  echo "== $name: exit $rc" | tee -a "$LOG"
}

prepare() {
  local wheels=(fastapi==0.115.12 starlette==0.46.2 uvicorn==0.34.3 httptools==0.6.4 pydantic==2.11.7
    pydantic-core==2.33.2 annotated-types==0.7.0 typing-inspection==0.4.1 openai==1.99.9 jiter==0.10.0 distro==1.9.0 sniffio==1.3.1 gguf==0.17.1)
  grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >>.git/info/exclude
  grep -qx "/.lease/" .git/info/exclude || echo "/.lease/" >>.git/info/exclude
  mkdir -p .whl .lease/part1/nanogpt .lease/part2
  for w in "${wheels[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 -d .whl "$w" || exit 1
  done
  local model
  model=$(.venv/bin/python -c "from lmforge.data.sources import smollm2_path; print(smollm2_path())") || exit 1
  split -b 48M "$model" .lease/gguf.
  mv .lease/gguf.aa .lease/part1/gguf.a && mv .lease/gguf.ab .lease/part2/gguf.b
  local repo=${NANOGPT_REPO:-/work/.mirror/karpathy+nanoGPT/repo}  # the `fetch github:karpathy/nanoGPT` snapshot
  for f in model.py train.py configurator.py; do git -C "$repo" show "$NANOGPT:$f" >.lease/part1/nanogpt/$f || exit 1; done
  .venv/bin/python -c "from lmforge.data.sources import shakespeare_text; print(shakespeare_text(), end='')" |
    gzip -9 >.lease/part1/shakespeare.txt.gz
  du -sh .whl .lease/part1 .lease/part2
}

setup() {  # the carried wheels into $LEASE/site (once a machine: part2 finds them there). Not typing-extensions:
  # the image's is newer, and its anyio needs that one (seen 2026-11-27)
  mkdir -p "$LEASE/cache/smollm2" ~/.cache/huggingface/hub  # transformers serve's /v1/models fails without the hub cache
  if [ -d .whl ] && [ ! -f "$LEASE/site/.done" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$LEASE/site" .whl/*.whl \
      && touch "$LEASE/site/.done" || echo "wheels: install failed" | tee -a "$LOG"
  fi
  { nvidia-smi -L; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"; } 2>&1 | tee -a "$LOG"
}

part1() {  # needs neither the wheels nor the GGUF: carry .lease/part1/nanogpt .lease/part1/shakespeare.txt.gz
  LOG=$OUT/part1.log        # alone, or .lease/part1 (and .whl) when part2 follows on the same machine
  setup
  [ -f .lease/part1/gguf.a ] && cp .lease/part1/gguf.a "$LEASE/gguf.a"
  gunzip -c .lease/part1/shakespeare.txt.gz >"$LEASE/shakespeare.txt"
  row 180 "training step vs nanoGPT's model and the trainer's own step, profiled (and the attention kernel order)" \
    $PY bench/train_profile.py --nanogpt .lease/part1/nanogpt --rounds 4 --out "$ROWS"
  row 150 "CUDA tests (graph runner, compiled step, sync-free steps, attention kernel order)" \
    $PY -m pytest -q -p no:cacheprovider tests/test_graph_runner.py tests/test_attention_kernel.py \
    tests/test_train_sync.py --junit-xml="$OUT/pytest.xml"
  row 200 "pretrain vs nanoGPT" \
    $PY bench/gpu.py --only pretrain --text "$LEASE/shakespeare.txt" --nanogpt .lease/part1/nanogpt --pretrain-steps 80 --out "$ROWS"
  row 180 "decoding, GPT-2 124M, batch 1 and 16: recorded, compiled, eager, transformers" \
    $PY bench/gpu.py --only decode --no-static --new-tokens 128 --gen-rounds 2 --out "$ROWS"
  cat "$ROWS"  # ~7-8 minutes on an H200 (2026-11-27), the open questions first; the SmolLM2 step rows: ``decode``
}

part2() {
  LOG=$OUT/part2.log
  setup
  if [ ! -f "$LEASE/gguf.a" ]; then echo "part2: $LEASE/gguf.a is missing (not the machine of part1)"; exit 1; fi
  cat "$LEASE/gguf.a" .lease/part2/gguf.b >"$LEASE/cache/smollm2/$GGUF"
  echo "$SHA  $LEASE/cache/smollm2/$GGUF" | sha256sum -c - | tee -a "$LOG" || exit 1
  row 90 "engine step, SmolLM2 bf16, 16 slots" $PY bench/gpu_step.py --model "$LEASE/cache/smollm2/$GGUF" \
    --slots 16 --rows 1 16 --out "$ROWS"
  row 45 "engine step, SmolLM2 bf16, 64 slots" $PY bench/gpu_step.py --model "$LEASE/cache/smollm2/$GGUF" \
    --slots 64 --rows 64 --runners graphs --out "$ROWS"
  row 60 "engine step, SmolLM2 bf16, fused attention" $PY bench/gpu_step.py --model "$LEASE/cache/smollm2/$GGUF" \
    --slots 16 --rows 1 16 --runners graphs --attention fused --out "$ROWS"
  row 330 "serve: lmforge (CUDA graphs, eager) vs transformers serve CB" \
    $PY bench/serve.py --device cuda --dtype bf16 --servers lmforge lmforge-eager transformers-cb \
    --clients 1 4 16 64 --slots 64 --requests 2 --prompts long --budget 45 --out "$ROWS" --logs "$OUT"
  if grep -q '"server": "lmforge serve", "error"' "$ROWS"; then  # the HTTP process forked beside CUDA: without
    row 150 "serve: lmforge, HTTP in a thread" $PY bench/serve.py --device cuda --dtype bf16 --servers lmforge \
      --clients 1 16 64 --slots 64 --requests 2 --prompts long --budget 60 --out "$ROWS" --logs "$OUT" \
      --lmforge-args=--no-http-process
  fi
  cat "$ROWS"
}

decode() {  # the decoding rows alone (carry nothing): GPT-2 decoding, the SmolLM2-shaped step, the graph tests' CUDA ones
  LOG=$OUT/decode.log
  setup
  row 130 "decoding, GPT-2 124M, batch 1 and 16: recorded, compiled, eager, transformers" \
    $PY bench/gpu.py --only decode --no-static --new-tokens 128 --gen-rounds 2 --out "$ROWS"
  row 70 "engine step, SmolLM2-135M shape (random weights), recorded vs compiled" \
    $PY bench/gpu_step.py --slots 16 --rows 1 16 --capacity 256 --steps 30 --runners graphs graphs-compiled --out "$ROWS"
  row 60 "CUDA tests of the graph runner" $PY -m pytest -q -p no:cacheprovider tests/test_graph_runner.py -k cuda \
    --junit-xml="$OUT/pytest.xml"
  cat "$ROWS"
}

smoke() {  # here, on the CPU: the same commands at tiny shapes (the serve rows: a short load, lmforge only)
  LOG=$OUT/smoke.log
  PYTHONPATH=$PWD/src
  PY=${PYTHON:-.venv/bin/python}
  local text=$OUT/shakespeare.txt
  [ -d .lease/part1 ] || { echo "smoke: run 'bench/gpu_lease.sh prepare' first"; exit 1; }
  gunzip -c .lease/part1/shakespeare.txt.gz | head -c 400000 >"$text"
  row 300 "CUDA tests (graph runner, sync-free steps)" $PY -m pytest -q -p no:cacheprovider tests/test_graph_runner.py \
    tests/test_attention_kernel.py tests/test_train_sync.py
  row 300 "decoding, smoke" $PY bench/gpu.py --smoke --only decode --no-static --out "$ROWS"
  row 300 "pretrain vs nanoGPT, smoke" $PY bench/gpu.py --smoke --only pretrain --text "$text" \
    --nanogpt .lease/part1/nanogpt --pretrain-steps 80 --out "$ROWS"
  row 300 "training step vs nanoGPT's model, smoke" $PY bench/train_profile.py --nanogpt .lease/part1/nanogpt \
    --smoke --out "$ROWS"
  row 300 "engine step, smoke" $PY bench/gpu_step.py --smoke --out "$ROWS"
  row 300 "engine step, fused attention, smoke" $PY bench/gpu_step.py --smoke --runners graphs --attention fused \
    --out "$ROWS"
  row 600 "serve, smoke" $PY bench/serve.py --servers lmforge lmforge-eager --clients 1 --requests 1 --new 8 \
    --budget 60 --out "$ROWS" --logs "$OUT"
  cat "$ROWS"
}

case "${1:-}" in
  prepare) prepare ;;
  part1) part1 ;;
  part2) part2 ;;
  decode) decode ;;
  smoke) smoke ;;
  *) echo "usage: bench/gpu_lease.sh prepare | part1 | part2 | decode | smoke" >&2; exit 2 ;;
esac
