"""Reproductions: grids declared as data, run locally or on Ray."""
