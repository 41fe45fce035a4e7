#!/usr/bin/env bash
# Cho et al.'s released code (HanseulJo/position-coupling at b9cad94) trained at lengthgen's CPU
# budget for multi-operand addition with the scratchpad and two-level coupling, beside
# `lengthgen reproduce coupling --scale cpu --tasks multi_operand_addition --arms coupled`: one T5
# layer of width 128 (d_ff 256) with 4 heads, RMSNorm before and after each sublayer, gated GELU,
# a learned table per level (n_positions 32, starts up to 31), AdamW (0.9, 0.95) at lr 1e-3 with
# their cosine schedule (1 % warm-up, down to 0.1), clipping at 1.0, 3,000 steps of 64; 2-5
# operands of 1-5 digits by their partially uniform law (192,000 samples drawn once: the 3,000 x 64
# that lengthgen draws fresh). Their teacher-forced exact match at the end, on 1,000 samples at each
# of (5 digits, 5 operands), (10, 5), (5, 10) and (10, 10), every operand of exactly that many
# digits, as lengthgen's rows are.
#
#   CODE=/path/to/position-coupling PKGS=/path/to/packages bash benchmarks/authors/position_coupling.sh SEED
#
# CODE: a checkout of their repository. PKGS: a folder with their dependencies that lengthgen's
# environment lacks (pip install --target "$PKGS" transformers==4.46.3 hydra-core==1.3.2
# omegaconf==2.3.0 dotmap==1.3.30 tokenizers==0.20.1 torchinfo) and a wandb.py that defines
# Settings and init (their run.py imports wandb; use_wandb stays false). Runs with lengthgen's
# python (torch 2.13, CPU); prints their log, whose last "Epoch 1/1 VAL..." lines hold the numbers,
# and keeps those lines and the log's last 40 as a record:
# benchmarks/records/YYYY-MM-DD-position_coupling-<machine>.json (benchmarks/README.md).
set -euo pipefail
SEED=${1:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
cd "${CODE:?set CODE to a checkout of HanseulJo/position-coupling}"
val() {  # a test set of exactly $2 digits and $3 operands
  echo "task.$1.min_n_digits=$2 task.$1.max_n_digits=$2 task.$1.min_n_operands=$3 task.$1.max_n_operands=$3 task.$1.n_data=1000"
}
overrides="device=cpu seed=$SEED seed_data=$SEED group_name=lengthgen_cpu exp_name=scratchpad_coupled
  model.position_encoding_type=abs_learned model.num_layers=1 model.num_heads=4 model.d_model=128 model.d_ff=256
  model.d_kv=32 model.normalization_layer=rmsnorm model.layer_norm_position=pre_post model.feed_forward_proj=gated-gelu
  model.n_positions=32 ++model.d_positions=2 ++model.share_pe=False ++model.compile=False
  task=multiple_addition_scratchpad_coupled task.max_position_digits=31 task.max_position_operands=31
  task.train.min_n_digits=1 task.train.max_n_digits=5 task.train.min_n_operands=2 task.train.max_n_operands=5
  task.train.n_data=192000 task.train.sampling_method_n_digits=partially_uniform task.train.threshold_partially_uniform=0.5
  $(val val 5 5) $(val val_many_digits 10 5) $(val val_many_operands 5 10) $(val val_long 10 10)
  training.batch_size_train=64 training.batch_size_eval=100 training.n_steps=3000 training.optimizer.lr=0.001
  training.optimizer.weight_decay=0"
args=()
for o in $overrides; do args+=(--overrides "$o"); done
PYTHONPATH="${PKGS:?set PKGS to the folder of their dependencies}" OMP_NUM_THREADS=${THREADS:-1} "$PYTHON" run.py "${args[@]}" \
  2>&1 | tee "$LOG"
# their VAL lines (and the log's end) as a record; RECORD=PATH writes it there, RECORD= writes none
if [ "${RECORD-default}" != "" ]; then
  "$PYTHON" - "$LOG" "$SEED" "${RECORD-}" "$HERE/position_coupling.sh" "$ROOT" <<'EOF'
import argparse, sys
from pathlib import Path
sys.path.insert(0, sys.argv[5])
from benchmarks.common import records
lines = Path(sys.argv[1]).read_text(errors="replace").splitlines()
args = argparse.Namespace(seed=int(sys.argv[2]), json=sys.argv[3] or None, no_record=False, note="")
records.write(sys.argv[4], args, {"val_lines": [line for line in lines if "VAL" in line][-8:],
                                  "log_tail": lines[-40:]}, device="cpu")
EOF
fi
