"""Reproductions: grids declared as data (grid.py, axes.py), a reproduction's options as one
object (request.py), its jobs (jobs.py), run locally (runner.py) or on Ray (ray_runner.py)."""
