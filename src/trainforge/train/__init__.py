"""Training: the loop and its helpers (precision, schedule, optimizer, checkpoints, micro-batching)."""
