"""`trainforge generate`'s sampling settings and their check: light (no torch), so a meaningless one is answered
before the model loads."""
from __future__ import annotations

import math

from trainforge.errors import UserError

MAX_NEW_TOKENS = 256
TEMPERATURE = 0.7
TOP_P = 0.9
SEED = 0


def check_settings(*, max_new_tokens: int, temperature: float, top_p: float, seed: int) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: must be at least 1, got {max_new_tokens!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):  # NaN too; inf would sample uniformly, not from the model
        raise UserError(f"--temperature: must be >= 0 and finite (0 = greedy, no sampling), got {temperature!r}")
    if not 0 < top_p <= 1:
        raise UserError(f"--top-p: must be in (0, 1] (1 = no nucleus cut), got {top_p!r}")
    if not isinstance(seed, int) or seed < 0:
        raise UserError(f"--seed: must be a non-negative integer, got {seed!r}")
