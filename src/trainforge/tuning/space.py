"""The search space: a YAML file of dotted config keys, each with how to sample it.

    # recipes/sweeps/digits_cnn.yaml
    optim.lr: {type: float, low: 1.0e-4, high: 3.0e-2, log: true}
    model.args.dropout: {type: float, low: 0.0, high: 0.4, step: 0.05}
    train.global_batch_size: {type: categorical, choices: [64, 128]}

    space = load_space(path, base_config_dict, info)   # {key: Param}, checked against the config
    params = suggest(trial, space)                     # {key: value}, sampled by the Optuna trial
    cfg = config_from_dict(apply_params(base_config_dict, params))

Every mistake is one `UserError` naming the file and the key, as for recipes.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Union

from trainforge.config import Config, config_from_dict, read_yaml, set_dotted
from trainforge.errors import UserError

TYPES = ("float", "int", "categorical")
FIELDS = ("type", "low", "high", "log", "step", "choices")
Scalar = Union[None, bool, int, float, str]


@dataclass(frozen=True)
class Param:
    """How one config key is sampled (Optuna's suggest_float / suggest_int / suggest_categorical)."""

    type: str
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: Optional[tuple[Scalar, ...]] = None

    def candidates(self) -> list[Any]:
        """Values that bound what sampling can produce: each choice, or both ends of the range."""
        if self.type == "categorical":
            return list(self.choices or ())
        return [self.low, self.high]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.choices is not None:
            d["choices"] = list(self.choices)
        return d


def param_from_dict(d: dict[str, Any]) -> Param:
    """Inverse of Param.to_dict (how a worker process receives the checked space)."""
    choices = d.get("choices")
    return Param(**{**d, "choices": None if choices is None else tuple(choices)})


# ---------------------------------------------------------------- parsing


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_param(where: str, spec: Any) -> Param:
    """One entry of the space file; `where` is `file: key` for the messages."""
    if not isinstance(spec, dict):
        raise UserError(f"{where}: expected a mapping like {{type: float, low: 1.0e-4, high: 1.0e-1, log: true}}, "
                        f"got {spec!r}")
    unknown = [k for k in spec if k not in FIELDS]
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}; valid fields: {', '.join(FIELDS)}")
    kind = spec.get("type")
    if kind not in TYPES:
        raise UserError(f"{where}: type must be one of {', '.join(TYPES)}, got {kind!r}")
    if kind == "categorical":
        extra = [k for k in ("low", "high", "log", "step") if k in spec]
        if extra:
            raise UserError(f"{where}: a categorical parameter takes only choices; remove {', '.join(extra)}")
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: a categorical parameter needs choices, a non-empty list, e.g. choices: [32, 64]")
        bad = [c for c in choices if not (c is None or isinstance(c, (bool, int, float, str)))]
        if bad:
            raise UserError(f"{where}: choices must be numbers, strings, booleans or null (Optuna stores only those), "
                            f"got {bad[0]!r}")
        if len(set(map(repr, choices))) != len(choices):
            raise UserError(f"{where}: choices has duplicates; list each value once")
        return Param("categorical", choices=tuple(choices))

    if "choices" in spec:
        raise UserError(f"{where}: choices is only for type: categorical; use low and high for {kind}")
    for end in ("low", "high"):
        if end not in spec:
            raise UserError(f"{where}: {kind} needs low and high; add {end}")
        value = spec[end]
        if not (_is_int(value) if kind == "int" else _is_number(value)):
            raise UserError(f"{where}: {end} must be {'an integer' if kind == 'int' else 'a finite number'}, got {value!r}")
    low, high = spec["low"], spec["high"]
    if low >= high:
        raise UserError(f"{where}: low ({low}) must be below high ({high}); swap them or widen the range")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{where}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise UserError(f"{where}: log: true needs low > 0, got low {low}; raise low or set log: false")
    step = spec.get("step")
    if step is not None:
        if log:
            raise UserError(f"{where}: step cannot be combined with log: true; remove one of them")
        if not (_is_int(step) if kind == "int" else _is_number(step)) or step <= 0:
            raise UserError(f"{where}: step must be a positive {'integer' if kind == 'int' else 'number'}, got {step!r}")
        spans = (high - low) / step
        if abs(spans - round(spans)) > 1e-9 * max(1.0, abs(spans)):
            raise UserError(f"{where}: high - low ({high - low:g}) must be a multiple of step ({step}); adjust high")
    if kind == "float":
        return Param("float", low=float(low), high=float(high), log=log, step=None if step is None else float(step))
    return Param("int", low=low, high=high, log=log, step=step)


def parse_space(path: Path) -> dict[str, Param]:
    """Read and check the file's own shape (types, ranges, fields); not yet the config keys."""
    raw = read_yaml(path, expected="a search space must be a YAML mapping of dotted config keys to "
                                   "{type, low, high, log, step, choices}", allow_empty=True)
    if not raw:
        raise UserError(f"{path}: the search space is empty; map at least one config key, "
                        "e.g. optim.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}")
    space: dict[str, Param] = {}
    for key, spec in raw.items():
        if not isinstance(key, str) or not key or not all(key.split(".")):
            raise UserError(f"{path}: {key!r} is not a dotted config key like optim.lr")
        space[key] = parse_param(f"{path}: {key}", spec)
    return space


# ---------------------------------------------------------------- the config side


def apply_params(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A copy of the config dict with the sampled values set (values stay typed: no YAML round trip)."""
    raw = copy.deepcopy(base)
    for key, value in params.items():
        set_dotted(raw, key.split("."), value, label=key)
    return raw


def _unknown_key(key: str) -> Optional[str]:
    """Why `key` names no config field (None when it does; keys under a free-form dict like model.args pass)."""
    model: Any = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            here = ".".join(parts[:i]) or "the top level"
            return f"unknown config key; valid keys under {here}: {', '.join(fields)}"
        ann = fields[part].annotation
        nested = [c for c in (ann, *getattr(ann, "__args__", ())) if isinstance(c, type) and hasattr(c, "model_fields")]
        if nested:
            model = nested[0]
            continue
        if i < len(parts) - 1 and not (ann is dict or getattr(ann, "__origin__", None) is dict):
            return f"{'.'.join(parts[: i + 1])} is a value, not a section; use {'.'.join(parts[: i + 1])}"
        return None  # a leaf field, or inside a free-form dict (model.args.*, data.args.*)
    return None


def check_space(path: Path, space: dict[str, Param], base: dict[str, Any], info: Any = None) -> None:
    """Every key must be a config key and every value sampling can produce must give a valid config.

    Each candidate (both ends of a range, each choice) is applied alone to the base config and validated;
    for model.* keys the model is also built on the meta device (no memory, no compute) when `info` is
    given, so a bad model argument is caught here instead of failing every trial.
    """
    for key, param in space.items():
        why = _unknown_key(key)
        if why:
            raise UserError(f"{path}: {key}: {why}")
        for value in param.candidates():
            try:
                cfg = config_from_dict(apply_params(base, {key: value}))
                if info is not None and key.startswith("model."):
                    check_model(cfg, info)
            except UserError as e:
                fix = "fix the key" if "unknown" in str(e) else "change the range or choices"
                raise UserError(f"{path}: {key} = {value!r} gives an invalid config: {e}; {fix}") from None


def check_model(cfg: Config, info: Any) -> None:
    from trainforge.engine.preflight import check_model as on_meta  # heavy (torch): only the model check needs it

    on_meta(cfg, info)


def load_space(path: Union[str, Path], base: dict[str, Any], info: Any = None) -> dict[str, Param]:
    """Parse the space file and check it against the base config (recipe + overrides, as a dict)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--space: {path} does not exist; point it at a YAML search space such as "
                        "recipes/sweeps/digits_cnn.yaml")
    space = parse_space(path)
    check_space(path, space, base, info)
    return space


# ---------------------------------------------------------------- sampling


def suggest(trial: Any, space: dict[str, Param]) -> dict[str, Any]:
    """Sample every key with the Optuna trial; the parameter names are the dotted config keys."""
    params: dict[str, Any] = {}
    for key, p in space.items():
        if p.type == "categorical":
            params[key] = trial.suggest_categorical(key, list(p.choices or ()))
        elif p.type == "int":
            params[key] = trial.suggest_int(key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        else:
            params[key] = trial.suggest_float(key, p.low, p.high, step=p.step, log=p.log)
    return params
