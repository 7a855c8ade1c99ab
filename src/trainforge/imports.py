"""Import the user's own code by "pkg.module:attr" — only ever because the user's config names it."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from typing import Any, Callable, Optional

from trainforge.errors import UserError

FORM = "'pkg.module:factory', e.g. 'my_models:build'"
_NOTHING = object()  # call_user: no positional first argument


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
        raise UserError(f"{key}: importing {module_name!r} failed: {where(e)}") from None
    except Exception as e:  # the user's module may fail in any way while importing
        raise UserError(f"{key}: importing {module_name!r} failed: {where(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{key}: module {module_name!r} has no attribute {attr!r}; expected {FORM}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{key}: {target} is not callable; expected {FORM}")
    return obj


def import_module(module_name: str, key: str) -> Any:
    """Import the module the user named (e.g. one that registers their own task); failures are a UserError naming
    `key`."""
    if not isinstance(module_name, str) or not all(part.isidentifier() for part in module_name.split(".")):
        raise UserError(f"{key}: {module_name!r} is not a module name; expected a dotted name such as 'my_tasks'")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise UserError(f"{key}: cannot import module {module_name!r} ({e}); it must be importable from the "
                            "current directory or PYTHONPATH") from None
        raise UserError(f"{key}: importing {module_name!r} failed: {where(e)}") from None
    except Exception as e:  # the user's module may fail in any way while importing
        raise UserError(f"{key}: importing {module_name!r} failed: {where(e)}") from None


def where(exc: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame: enough to find the mistake in the user's code."""
    tb = traceback.extract_tb(exc.__traceback__)
    place = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{place}"


def signature_text(obj: Callable[..., Any], name: Optional[str] = None) -> str:
    """`my_models:MyCNN(in_channels, num_classes, width=32)`: how the user's callable is declared, for error lines."""
    name = name or getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return f"{name}(...)"


def call_user(
    obj: Callable[..., Any],
    *,
    target: str,
    key: str,
    args_key: str,
    args: dict[str, Any],
    filled: dict[str, Any],
    first: Any = _NOTHING,
) -> Any:
    """Call the user's `obj` (imported from `target`), binding each parameter by name: from `args` (the config's `<args_key>`), else from
    `filled` (what the run knows, e.g. the data's `num_classes`; a None value there means "not known for this
    data"), else, for the first positional parameter of a plain function, `first` (the documented factory
    form `f(info, **args)`). Unknown or missing arguments, and any exception the user's code raises while
    being called, are one UserError line that shows the expected signature.
    """
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): the call decides
        params = None
    declared = signature_text(obj, target)
    if params is not None:
        bound, unknown = _bind(obj, params, args, filled, first)
        if unknown:
            accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            raise UserError(f"{args_key}.{unknown[0]}: unknown argument for {declared}; "
                            f"accepted: {', '.join(a for a in accepted if a not in filled) or 'none'}")
        missing = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and p.name not in bound]
        if missing:
            p = missing[0]
            if p.name in filled:  # named like a fact of the data, but this data does not have it
                raise UserError(f"{key}: {declared} needs {p.name}, which this data does not provide; "
                                f"give it a default or set {args_key}.{p.name}")
            known = ", ".join(sorted(n for n, v in filled.items() if v is not None))
            raise UserError(f"{args_key}.{p.name}: required by {declared}; set {args_key}.{p.name}, or name the "
                            f"parameter after what the run provides ({known})")
        call_args, call_kwargs = bound.pop(_FIRST, ()), bound
    else:
        call_args, call_kwargs = (), dict(args)
    try:
        return obj(*call_args, **call_kwargs)
    except UserError:
        raise
    except Exception as e:  # the user's code may fail in any way: one line with where, not a traceback
        raise UserError(f"{key}: {declared} failed: {where(e)}") from None


_FIRST = "\0first"  # the positional argument of the factory form, kept apart from keyword names


def _bind(obj: Any, params: list[inspect.Parameter], args: dict[str, Any], filled: dict[str, Any],
          first: Any) -> tuple[dict[str, Any], list[str]]:
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    bound: dict[str, Any] = {}
    unknown = [k for k in args if k not in names and not takes_any]
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        if p.name in args:
            bound[p.name] = args[p.name]
        elif filled.get(p.name) is not None:
            bound[p.name] = filled[p.name]
        elif (first is not _NOTHING and not inspect.isclass(obj) and p is params[0]
              and p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in filled):
            bound[_FIRST] = (first,)
    if takes_any:
        bound.update({k: v for k, v in args.items() if k not in names})
    return bound, unknown
