#!/usr/bin/env bash
# The GPU check, one command on a machine with one GPU and a source checkout (torch with CUDA,
# numpy, tqdm, safetensors; no install needed). Writes everything under $OUT (default ./gpu-check):
#   part "bench":  a tiny captured training run through the CLI against an eager one and a captured
#                  one compiled whole (same losses, the graphs recorded, a checkpoint that resumes),
#                  then benchmarks/gpu.py
#                  (at most about 6 minutes; with the authors' code where .authors holds it)
#   part "paper":  the looped Parity paper preset trained for SECONDS seconds (default 270), its
#                  checkpoints kept (train --resume continues it), then evaluated at lengths 20 and
#                  40 with the oracle stop
#   part "hours":  a captured training step of every run of the looped, TRA and sparsity paper
#                  grids (benchmarks/paper_hours.py --capture): the measured GPU hours of each grid,
#                  SECONDS seconds a grid at most (default 100)
#
#     bash benchmarks/gpu_check.sh bench|paper|hours|all [SECONDS]
#
# A session of 15 device minutes (a start takes 2-3): `bench` first, with
# BENCH_ARGS="--procs 1 --no-content" (several processes and TRA were measured on 2026-11-27),
# then `hours 90` or `paper 200` in a second call while the machine is warm.
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

tiny=(--set method=looped --set task.name=parity --set task.train_max=8 --set model.d_model=64 --set model.n_head=4
      --set model.n_layer=1 --set train.steps=300 --set train.batch_size=32 --set train.log_interval=50
      --set train.checkpoint_interval=200 --set train.device=cuda --set data.curriculum_start=2
      --set data.curriculum_interval=30 --set optim.schedule=curriculum_cosine --set optim.cosine_start=200
      --set eval.lengths=8,12 --set eval.samples=256)

if [ "$1" = bench ] || [ "$1" = all ]; then
  for capture in true false compiled; do
    how=(--set train.capture=$capture); [ $capture = compiled ] && how=(--set train.capture=true --set train.compile=true)
    timeout 150 python3 -m lengthgen train "${tiny[@]}" "${how[@]}" --out "$OUT/tiny-$capture" --no-progress \
      2> "$OUT/tiny-$capture.err" || tail -3 "$OUT/tiny-$capture.err"
  done
  python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
rows = {c: [json.loads(l) for l in (Path(sys.argv[1]) / f"tiny-{c}/metrics.jsonl").open()] for c in ("true", "false", "compiled")}
for a, b, c in zip(rows["true"], rows["false"], rows["compiled"]):
    print(f"step {a['step']}: loss captured {a['loss']:.6f} eager {b['loss']:.6f} compiled whole {c['loss']:.6f} "
          f"graphs {a.get('cuda_graphs')} compiled graphs {c.get('compiled_graphs')} time {a['time']:.1f} {b['time']:.1f} {c['time']:.1f} s")
EOF
  timeout 60 python3 -m lengthgen eval "$OUT/tiny-true" --no-progress 2>&1 | tail -4
  # a checkpoint a recorded run wrote resumes (its optimizer state saved as an eager run reads it)
  timeout -s INT 18 python3 -m lengthgen train "${tiny[@]}" --set train.steps=100000 --set train.checkpoint_interval=300 \
    --out "$OUT/tiny-resume" --no-progress 2> /dev/null
  timeout -s INT 12 python3 -m lengthgen train --resume --out "$OUT/tiny-resume" --no-progress 2>&1 | grep -v "it/s" | tail -2
  tail -1 "$OUT/tiny-resume/metrics.jsonl"
  authors=(); [ -d .authors/looped-tf ] && authors=(--authors .authors)
  timeout "${BENCH_SECONDS:-360}" python3 benchmarks/gpu.py --json "$OUT/gpu.json" "${authors[@]}" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/gpu.txt"
fi
if [ "$1" = paper ] || [ "$1" = all ]; then
  run="$OUT/parity-paper"
  start=(experiments/looped/paper/parity.toml --set train.device=cuda --set train.checkpoint_interval=2000)
  [ -d "$run/checkpoints" ] && start=(--resume)  # a later session continues the run it brought back
  timeout -s INT "${2:-270}" python3 -m lengthgen train "${start[@]}" --out "$run" --no-progress 2> "$run.err"
  echo "train exit $?"; grep -v "it/s" "$run.err" | tail -3
  tail -2 "$run/metrics.jsonl"
  python3 -m lengthgen eval "$run" --lengths 20,40 --samples 1024 --no-progress 2>&1 | tail -6
fi
if [ "$1" = hours ]; then
  for paper in looped tra sparsity; do
    timeout "${2:-100}" python3 benchmarks/paper_hours.py "$paper" --device cuda --steps 5 --capture 2>&1 \
      | tee "$OUT/hours-$paper.txt"
  done
fi
