"""What the test files share, imported as `from tests.helpers.<module> import ...`:

- tiny_runs: the toy copy run the safety and fault tests train (`TINY`, `tiny`, `train_cli`,
  `killed_after`), the stderr checks of one-line errors (`error_lines`, `one_line_error`) and
  `tree`, a folder's files and bytes, to check that a refused command changed nothing.
- toy_papers: toy presets and grids (`toy_preset`, `positions_grid`, `toy_paper`) small enough that
  a whole grid trains in seconds, for the grid, reproduction, Ray, export and fault tests.
- golden: the golden runs of tests/test_golden.py, a tiny run of each method family, pinned in
  golden.json beside it; `.venv/bin/python tests/helpers/golden.py` writes them anew.
- task_checks: brute-force solvers of the built-in tasks and the batch-layout checks.
- preset_tables: the per-setting tables of a paper's doc, read to check its presets against them.
- documents: a small local text corpus and the `docs` fixture for the language-model tests.
- limited_calls: `lengthgen` calls in a subprocess under memory, file-size and permission limits,
  for the tests that make a fault happen for real.
"""
