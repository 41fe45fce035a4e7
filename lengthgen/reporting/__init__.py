"""Reporting: series over seeds, tables, figures, training curves, the report."""
