"""What runs leave behind, as plain files: evaluation rows (eval.csv, per_step.csv), the training
log (metrics.jsonl) and the per-token files of a language-model run. Written by evaluation and
training, read by reporting; this layer imports no model code, so neither does a report."""
