#!/usr/bin/env bash
# The GPU check, one command on a machine with one GPU and a source checkout (torch with CUDA,
# numpy, tqdm, safetensors; no install needed). Writes everything under $OUT (default ./gpu-check);
# the benchmarks' JSON records under $OUT/records/, named as benchmarks/README.md says, to be copied
# into benchmarks/records/:
#   part "bench":  a tiny captured training run through the CLI against an eager one and a captured
#                  one compiled whole (same losses, the graphs recorded, a checkpoint that resumes),
#                  then benchmarks/speed/gpu.py (with the authors' code where .authors holds it)
#   part "paper":  the looped Parity paper preset trained for SECONDS seconds (default 270), its
#                  checkpoints kept (train --resume continues it), then evaluated at lengths 20 and
#                  40 with the oracle stop
#   part "hours":  a captured training step of every run of the looped, TRA and sparsity paper
#                  grids (benchmarks/estimates/paper_hours.py --capture): the measured GPU hours of
#                  each grid, SECONDS seconds a grid at most (default 100)
#
#     bash benchmarks/gpu_check.sh bench|paper|hours|all [SECONDS]
#
# What each part costs, in wall seconds, to plan a run of it by. "measured": on one NVIDIA H200
# (torch 2.11.0+cu130), 2026-11-27 (docs/benchmarks.md "One GPU", docs/results.md "Looped
# Transformers, paper scale on one GPU"); "bound": a timeout in this script caps it; "estimated":
# not yet timed on any GPU. Nothing here has been timed on an H100. The machine's own start comes on
# top. Each part prints its seconds when it ends (also in $OUT/part-seconds.txt, with the card), so
# every run measures these lines again.
#   part                                              seconds              how known
#   bench: three tiny CLI runs (300 steps each)       <= 450               bound (150 each); estimated 30-60 eager
#                                                                          or captured, 60-120 compiled whole
#   bench: eval of the tiny run, the resume check     <= 90                bound (60 + 18 + 12)
#   bench: benchmarks/speed/gpu.py, every part        about 360            measured (about 6 min, most of it
#                                                                          compiling); bound: BENCH_SECONDS (360)
#   bench: gpu.py with BENCH_ARGS="--no-compile --procs 1 --no-content"
#                                                     90-150               estimated; each --procs entry adds
#                                                                          about --seconds (8) + 20
#   paper SECONDS                                     SECONDS + about 60   SECONDS bound (150 s trained 13.5k
#                                                                          steps, measured); the eval at 20 and
#                                                                          40 and the starts: estimated
#   hours SECONDS                                     <= 3 x SECONDS       bound (3 grids, SECONDS each)
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT/records"
took() {  # a part's wall seconds, printed and kept: what the header's costs are measured by
  echo "part $1 took $(( SECONDS - $2 )) s on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    | tee -a "$OUT/part-seconds.txt"
}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

tiny=(--set method=looped --set task.name=parity --set task.train_max=8 --set model.d_model=64 --set model.n_head=4
      --set model.n_layer=1 --set train.steps=300 --set train.batch_size=32 --set train.log_interval=50
      --set train.checkpoint_interval=200 --set train.device=cuda --set data.curriculum_start=2
      --set data.curriculum_interval=30 --set optim.schedule=curriculum_cosine --set optim.cosine_start=200
      --set eval.lengths=8,12 --set eval.samples=256)

if [ "$1" = bench ] || [ "$1" = all ]; then
  began=$SECONDS
  for capture in true false compiled; do
    how=(--set train.capture=$capture)
    [ $capture = compiled ] && how=(--set train.capture=true --set train.compile=true)
    timeout 150 python3 -m lengthgen train "${tiny[@]}" "${how[@]}" --out "$OUT/tiny-$capture" --no-progress \
      2> "$OUT/tiny-$capture.err" || tail -3 "$OUT/tiny-$capture.err"
  done
  python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
rows = {c: [json.loads(l) for l in (Path(sys.argv[1]) / f"tiny-{c}/metrics.jsonl").open()]
        for c in ("true", "false", "compiled")}
for a, b, c in zip(rows["true"], rows["false"], rows["compiled"]):
    print(f"step {a['step']}: loss captured {a['loss']:.6f} eager {b['loss']:.6f} compiled whole {c['loss']:.6f} "
          f"graphs {a.get('cuda_graphs')} compiled graphs {c.get('compiled_graphs')} "
          f"time {a['time']:.1f} {b['time']:.1f} {c['time']:.1f} s")
EOF
  timeout 60 python3 -m lengthgen eval "$OUT/tiny-true" --no-progress 2>&1 | tail -4
  # a checkpoint a recorded run wrote resumes (its optimizer state saved as an eager run reads it)
  timeout -s INT 18 python3 -m lengthgen train "${tiny[@]}" --set train.steps=100000 \
    --set train.checkpoint_interval=300 --out "$OUT/tiny-resume" --no-progress 2> /dev/null
  timeout -s INT 12 python3 -m lengthgen train --resume --out "$OUT/tiny-resume" --no-progress 2>&1 \
    | grep -v "it/s" | tail -2
  tail -1 "$OUT/tiny-resume/metrics.jsonl"
  authors=(); [ -d .authors/looped-tf ] && authors=(--authors .authors)
  took bench-tiny "$began"
  began=$SECONDS
  timeout "${BENCH_SECONDS:-360}" python3 benchmarks/speed/gpu.py --json "$OUT/records/" "${authors[@]}" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu.txt"
  took bench-gpu.py "$began"
fi
if [ "$1" = paper ] || [ "$1" = all ]; then
  began=$SECONDS
  run="$OUT/parity-paper"
  start=(experiments/looped/paper/parity.toml --set train.device=cuda --set train.checkpoint_interval=2000)
  [ -d "$run/checkpoints" ] && start=(--resume)  # a run folder carried back in $OUT continues
  timeout -s INT "${2:-270}" python3 -m lengthgen train "${start[@]}" --out "$run" --no-progress 2> "$run.err"
  echo "train exit $?"; grep -v "it/s" "$run.err" | tail -3
  tail -2 "$run/metrics.jsonl"
  python3 -m lengthgen eval "$run" --lengths 20,40 --samples 1024 --no-progress 2>&1 | tail -6
  took paper "$began"
fi
if [ "$1" = hours ]; then
  began=$SECONDS
  for paper in looped tra sparsity; do
    timeout "${2:-100}" python3 benchmarks/estimates/paper_hours.py "$paper" --device cuda --steps 5 --capture \
      --json "$OUT/records/" 2>&1 | tee "$OUT/hours-$paper.txt"
  done
  took hours "$began"
fi
