"""Training (`trainforge.training`; the `trainforge.train(...)` function is the API): the loop and its helpers (precision, schedule, optimizer, checkpoints, micro-batching)."""
