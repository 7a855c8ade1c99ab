"""Multi-device wrappers applied to a zoo model from outside: activation checkpointing, FSDP2."""
