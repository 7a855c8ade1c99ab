"""The engine: what one training step is made of, without the run around it (layer 2: imports only the foundations,
`data/` and `models/`). Losses, precision, the optimizer and its schedule, micro-batching, EMA, early stopping,
randomness, signals, checkpoints, metrics, progress, and the process group with its strategies (env, parallelize,
data_parallel). `training/` runs these; `planning/` estimates with them."""
