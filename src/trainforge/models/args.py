"""Checks for `model.args` values: each returns the clean value or raises a one-line `UserError`.

Factories call these on their arguments so a wrong value names `model.args.<key>` and says what
is expected, instead of failing deep inside torch with a shape error.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from trainforge.errors import UserError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(key: str, value: Any) -> int:
    if not _is_int(value) or value <= 0:
        raise UserError(f"model.args.{key}: expected a positive integer, got {value!r}")
    return value


def positive_number(key: str, value: Any) -> float:
    if not _is_number(value) or value <= 0:
        raise UserError(f"model.args.{key}: expected a positive number, got {value!r}")
    return float(value)


def probability(key: str, value: Any) -> float:
    """A dropout rate: 1.0 would zero every activation, so the range is [0, 1)."""
    if not _is_number(value) or not 0 <= value < 1:
        raise UserError(f"model.args.{key}: expected a number in [0, 1), got {value!r}")
    return float(value)


def flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"model.args.{key}: expected true or false, got {value!r}")
    return value


def int_list(key: str, value: Any, allow_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) and v > 0 for v in value):
        raise UserError(f"model.args.{key}: expected a list of positive integers, e.g. [32, 64], got {value!r}")
    if not value and not allow_empty:
        raise UserError(f"model.args.{key}: expected at least one entry, got an empty list")
    return tuple(value)


def choice(key: str, value: Any, options: Sequence[str]) -> str:
    if value not in options:
        raise UserError(f"model.args.{key}: expected one of {', '.join(options)}, got {value!r}")
    return value


def heads_divide(heads_key: str, heads: int, dim_key: str, dim: int) -> None:
    """Attention splits the width evenly across heads."""
    if dim % heads:
        divisors = [d for d in range(1, min(dim, 32) + 1) if dim % d == 0]
        raise UserError(
            f"model.args.{heads_key}: {heads} heads do not divide {dim_key}={dim}; "
            f"choose one of {', '.join(map(str, divisors))} or change {dim_key}"
        )
