"""Configuration: the schema of every key (schema.py) each section's own checks (checks.py), schedules of the step (schedules.py): plain data."""
