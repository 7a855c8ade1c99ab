"""Planning a run before it starts: simulated memory and FLOPs of one training step."""
