"""What every benchmark shares: the clock (timing), the trainer's own step (steps), the JSON records (records)."""
