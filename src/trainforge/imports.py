"""Import the user's own code by "pkg.module:attr" — only ever because the user's config names it."""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any, Callable, Optional

from trainforge.errors import UserError

FORM = "'pkg.module:factory', e.g. 'my_models:build'"


def load_target(target: Optional[str], key: str) -> Callable[..., Any]:
    """Import `pkg.module:attr` and return the callable; every failure is a UserError naming `key`."""
    if target is None:
        raise UserError(f"{key}: required for a custom {key.split('.')[0]}; set it to {FORM}")
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise UserError(f"{key}: expected {FORM}, got {target!r}")
    module_name, attr = target.split(":")
    # console scripts do not put the working directory on sys.path; `python -m` does. Users expect
    # a my_models.py next to their recipe to import either way.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise UserError(
                f"{key}: cannot import module {module_name!r} ({e}); "
                f"expected {FORM} importable from the current directory or PYTHONPATH"
            ) from None
        raise UserError(f"{key}: importing {module_name!r} failed: {_where(e)}") from None
    except Exception as e:  # the user's module may fail in any way while importing
        raise UserError(f"{key}: importing {module_name!r} failed: {_where(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{key}: module {module_name!r} has no attribute {attr!r}; expected {FORM}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{key}: {target} is not callable; expected {FORM}")
    return obj


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame: enough to find the mistake in the user's code."""
    tb = traceback.extract_tb(exc.__traceback__)
    place = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{place}"
