"""The trained model as an artifact: final/model.safetensors + final/model.json, and loading it back.

model.json carries everything needed to rebuild and serve the model without the original YAML:
the resolved config, the data facts (shapes, classes), the preprocessing statistics and the step.
final/manifest.json (written last) records the SHA-256 of both; loading checks them unless told not to.
Any of a run directory, its final/ or a checkpoints/step-* directory can be loaded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from safetensors.torch import save_file
from torch import nn

from trainforge.config import Config, config_from_yaml_text
from trainforge.data.base import DataInfo, InputInfo
from trainforge.data.modalities import MODALITIES
from trainforge.errors import UserError, quote
from trainforge.imports import load_target
from trainforge.integrity import MANIFEST_FILE, NO_VERIFY, check_files, read_digests, write_manifest
from trainforge.engine.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    contiguous_state,
    find_resume_checkpoint,
    is_sharded,
    kept_weights,
    load_checkpoint,
    load_model_weights,
    load_sharded_into,
    load_state,
    load_weights,
)
from trainforge.models import build_model
from trainforge.models.lora import check_base
from trainforge.models.resize import resize_to_weights
from trainforge.layout import CHECKPOINTS, CONFIG_TEXT, FINAL, META
from trainforge.tasks import TASKS

FORMAT = "trainforge-model/1"
META_FILE = META
FINAL_FILES = (MODEL_FILE, META_FILE)  # what loading final/ reads, so what its manifest must vouch for
# What a stored data_info may say: far above any real dataset, low enough that building the model from it is sane
TASK_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")  # a task registered by a custom source or model module, loaded later
MAX_INPUT_DIMS = 4  # image C,H,W; tabular F; text T
MAX_DIM = 2**24  # one dimension of a sample (a sequence of 16M tokens, an image 16M pixels wide)
MAX_INPUT_ELEMENTS = 2**30  # values in one sample
MAX_INPUTS = 16  # named inputs of one sample (data_info.inputs)
MAX_CLASSES = 2**24  # classes, or an LM's vocabulary


@dataclass
class Trained:
    config: Config
    info: DataInfo
    preprocess: dict[str, Any]
    weights: dict[str, torch.Tensor]
    step: int
    source: Path
    base: Optional[dict[str, Any]] = None  # LoRA: the frozen base the weights (adapters) build on

    def build_model(self) -> nn.Module:
        model, _ = build_model(self.config.model, self.info)
        check_base(self.base, model, str(self.source))
        if self.config.stage.pruned:
            resize_to_weights(model, self.weights)
        load_model_weights(model, self.weights)
        return model


def info_to_dict(info: DataInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


class BadField(ValueError):
    """A field of a stored file that cannot be what it says; the message names it (`fields_of` adds the file)."""


def _count(field: str, value: Any, low: int, high: int, optional: bool = False) -> Optional[int]:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadField(f"data_info.{field}: expected an integer in {low}..{high}, got {quote(value)}")
    return value


def info_from_dict(d: dict[str, Any]) -> DataInfo:
    """The DataInfo a checkpoint or final/model.json stores, every field checked (BadField naming it): the model
    is built from these numbers, so a `1e30`, a "ten" or a huge count must stop here, not deep inside torch."""
    if not isinstance(d, dict):
        raise BadField(f"data_info: expected a mapping of the data's facts, got {quote(d)}")
    known = {f.name for f in dataclasses.fields(DataInfo)}
    unknown = sorted(set(d) - known, key=str)
    if unknown:
        raise BadField(f"data_info: unknown field {quote(unknown[0])}; the fields are {', '.join(sorted(known))}")
    task = d.get("task")
    if not (task in TASKS or (isinstance(task, str) and TASK_NAME.fullmatch(task))):
        raise BadField(f"data_info.task: expected a task name (one of {', '.join(TASKS.names())}, or a registered "
                       f"one's), got {quote(task)}")
    if not _modality_name(d.get("modality")):
        raise BadField(f"data_info.modality: expected a modality name (one of {', '.join(MODALITIES.names())}, or a "
                       f"registered one's), got {quote(d.get('modality'))}")
    if d.get("input_dtype") not in ("float32", "int64"):
        raise BadField(f"data_info.input_dtype: expected one of float32, int64, got {quote(d.get('input_dtype'))}")
    shape = d.get("input_shape")
    if not isinstance(shape, (list, tuple)) or not 1 <= len(shape) <= MAX_INPUT_DIMS:
        raise BadField(f"data_info.input_shape: expected a list of 1 to {MAX_INPUT_DIMS} sizes, got {quote(shape)}")
    shape = tuple(_count(f"input_shape[{i}]", n, 1, MAX_DIM) for i, n in enumerate(shape))
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise BadField(f"data_info.input_shape: {list(shape)} is more than {MAX_INPUT_ELEMENTS} values per sample")
    num_classes = _count("num_classes", d.get("num_classes"), 1, MAX_CLASSES)
    names = d.get("class_names") or ()
    if not isinstance(names, (list, tuple)) or len(names) > num_classes or not all(isinstance(n, str) for n in names):
        raise BadField(f"data_info.class_names: expected at most num_classes ({num_classes}) names, got {quote(names)}")
    inputs = _inputs(d.get("inputs") or ())
    pillar_grid = _pillar_grid(d.get("pillar_grid") or ())
    return DataInfo(pillar_grid=pillar_grid,
        inputs=inputs, task=d["task"], modality=d["modality"], input_shape=shape, input_dtype=d["input_dtype"], num_classes=num_classes,
        class_names=tuple(names), vocab_size=_count("vocab_size", d.get("vocab_size"), 1, MAX_CLASSES, optional=True),
        seq_len=_count("seq_len", d.get("seq_len"), 1, MAX_DIM, optional=True),
        pad_id=_count("pad_id", d.get("pad_id"), 0, MAX_CLASSES, optional=True))


MAX_EXTENT_M = 10_000.0  # a point cloud's range: a sensor sees hundreds of metres


def _pillar_grid(value: Any) -> tuple[float, ...]:
    """data_info.pillar_grid: empty, or a range (6 finite numbers, each min below its max, within MAX_EXTENT_M), a
    pillar size (3 numbers above 0) that cut at most MAX_DIM cells a side, and three counts (points a pillar,
    pillars in training, in evaluation) of at most MAX_DIM each."""
    if value in ((), []):
        return ()
    bad = BadField(f"data_info.pillar_grid: expected x_min y_min z_min x_max y_max z_max, a voxel's x y z size, "
                   f"max_points_per_voxel and max_voxels (train, eval), got {quote(value)}")
    if not isinstance(value, (list, tuple)) or len(value) != 12:
        raise bad
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise bad
    r, size, counts = [float(v) for v in value[:6]], [float(v) for v in value[6:9]], value[9:]
    if not all(-MAX_EXTENT_M <= v <= MAX_EXTENT_M for v in r) or not all(r[i] < r[i + 3] for i in range(3)):
        raise bad
    if not all(v > 0 and (r[i + 3] - r[i]) / v <= MAX_DIM for i, v in enumerate(size)):
        raise bad
    if not all(float(c).is_integer() and 1 <= c <= MAX_DIM for c in counts):
        raise bad
    return tuple(r + size + [int(c) for c in counts])


def _modality_name(value: Any) -> bool:
    """A registered modality, or the name of one a plug-in module registers (as for tasks)."""
    return value in MODALITIES or (isinstance(value, str) and TASK_NAME.fullmatch(value) is not None)


def _inputs(value: Any) -> tuple[InputInfo, ...]:
    """data_info.inputs: at most MAX_INPUTS named inputs, each checked as input_shape and input_dtype are."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_INPUTS:
        raise BadField(f"data_info.inputs: expected a list of at most {MAX_INPUTS} inputs, got {quote(value)}")
    out = []
    for i, one in enumerate(value):
        where = f"data_info.inputs[{i}]"
        if not isinstance(one, dict) or set(one) != {"name", "shape", "dtype", "modality"}:
            raise BadField(f"{where}: expected {{name, shape, dtype, modality}}, got {quote(one)}")
        if not isinstance(one["name"], str) or not TASK_NAME.fullmatch(one["name"]):
            raise BadField(f"{where}.name: expected a lower-case name, got {quote(one['name'])}")
        if one["dtype"] not in ("float32", "int64") or not _modality_name(one["modality"]):
            raise BadField(f"{where}: dtype float32 or int64, modality one of {', '.join(MODALITIES.names())} (or a "
                           "registered one's)")
        shape = one["shape"]
        if not isinstance(shape, (list, tuple)) or not 1 <= len(shape) <= MAX_INPUT_DIMS:
            raise BadField(f"{where}.shape: expected a list of 1 to {MAX_INPUT_DIMS} sizes, got {quote(shape)}")
        shape = tuple(_count(f"inputs[{i}].shape[{j}]", n, 1, MAX_DIM) for j, n in enumerate(shape))
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise BadField(f"{where}.shape: {list(shape)} is more than {MAX_INPUT_ELEMENTS} values per sample")
        out.append(InputInfo(one["name"], shape, one["dtype"], one["modality"]))
    return tuple(out)


def save_final_model(
    run_dir: Path,
    model_state: dict[str, torch.Tensor],
    config: Config,
    info: DataInfo,
    preprocess: dict[str, Any],
    step: int,
    metrics: Optional[dict[str, Any]] = None,
    ran: Optional[dict[str, Any]] = None,
    native: Optional[dict[str, Callable[[Path], None]]] = None,
    base: Optional[dict[str, Any]] = None,
) -> Path:
    """Write final/ atomically (temp dir, rename), replacing a previous final/.

    `step` and `metrics` are those of the weights saved (the best evaluation under early stopping); `ran`
    records the batch geometry that actually ran (config.yaml keeps what was asked for). `native`: {folder:
    write} for a model with formats of its own (an `hf` model's save_pretrained into final/hf/, a LoRA run's
    adapters into final/adapter/), each written into its folder before final/ is sealed, with a manifest of
    its own. `base`: a LoRA run's frozen base (source, SHA-256); `model_state` then holds the adapters."""
    final = run_dir / FINAL
    tmp = run_dir / f".tmp-final-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(contiguous_state(model_state), str(tmp / MODEL_FILE), metadata={"format": FORMAT})
    meta = {
        "format": FORMAT,
        "step": step,
        "model": config.model.model_dump(mode="json"),
        "data_info": info_to_dict(info),
        "preprocess": preprocess,
        "metrics": metrics or {},
        "ran": ran or {},
        CONFIG_TEXT: config.to_yaml(),
        "base": base,
    }
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
    for folder, write in (native or {}).items():
        write(tmp / folder)
        write_manifest(tmp / folder)
    write_manifest(tmp)
    if final.exists():
        old = run_dir / f".old-final-{os.getpid()}"
        os.replace(final, old)
        shutil.rmtree(old)
    os.replace(tmp, final)
    return final


def load_trained(path: Path, verify: bool = True) -> Trained:
    """A run dir (its final model, else its newest checkpoint), a final/ dir, or a checkpoint dir.

    With `verify` (the default) every file read must match its manifest's SHA-256 (UserError otherwise).
    A task that is not shipped is registered by the run's own code: the modules its data.target and model.target
    name (which rebuilding its data and model imports anyway) are imported first.
    """
    trained = _load_trained(path, verify)
    register_run_task(trained.config, trained.info)
    return trained


def register_run_task(config: Config, info: DataInfo) -> None:
    """Import the run's data.target and model.target modules when its task is not registered yet."""
    if info.task in TASKS:
        return
    for target, key in ((config.data.target, "data.target"), (config.model.target, "model.target")):
        if isinstance(target, str) and ":" in target:
            load_target(target, key)
    if info.task not in TASKS:
        raise UserError(f"data_info.task: {info.task!r} is not a registered task, and neither the run's data.target "
                        "nor its model.target registers it; import the module that does, or retrain")


def _load_trained(path: Path, verify: bool) -> Trained:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    if (path / FINAL).is_dir():  # the run's final model, even with a file missing (verification names it)
        path = path / FINAL
    if (path / META_FILE).is_file() or path.name == FINAL:
        if verify:
            verify_final(path)
        return read_final(path)
    if (path / CHECKPOINTS).is_dir():
        found = find_resume_checkpoint(path / CHECKPOINTS)
        if found is None:
            raise UserError(f"{path}: run directory has no final model and no complete checkpoint")
        path = found
    if not (path / MANIFEST_FILE).is_file():
        raise UserError(f"{path}: not a run directory, final/ or checkpoints/step-* directory")
    if is_sharded(path):
        weights, state = None, load_state(path, verify)
    else:
        weights, state = load_checkpoint(path, verify)
    with fields_of(path / STATE_FILE):
        config, info = config_from_yaml_text(state[CONFIG_TEXT]), info_from_dict(json.loads(state["data_info_json"]))
        preprocess, step = json.loads(state["preprocess_json"]), int(state["step"])
        base = json.loads(state.get("base_json") or "null")
    if weights is None:  # an FSDP checkpoint: gather its shards into whole tensors in this one process

        model, _ = build_model(config.model, info)
        weights = {"model": kept_weights(model, model.state_dict())}
        load_sharded_into(path, weights)
        weights = weights["model"]
    return Trained(config=config, info=info, preprocess=preprocess, weights=weights, step=step, source=path, base=base)


def verify_final(path: Path) -> None:
    """final/'s model.safetensors and model.json against final/manifest.json (UserError naming the file)."""
    unverifiable = f"{NO_VERIFY} (a final/ written before trainforge kept manifests), or re-run training"
    digests = read_digests(path, unverifiable)
    check_files(path, digests, FINAL_FILES, unverifiable=unverifiable,
                fix="restore final/ from a good copy, or use one of the run's checkpoints/step-* directories")


def read_final(path: Path) -> Trained:
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path / META_FILE}: not readable JSON ({e}); restore final/ or re-run training") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise UserError(f"{path / META_FILE}: not a trainforge model (format {found!r})")
    with fields_of(path / META_FILE):
        config, info = config_from_yaml_text(meta[CONFIG_TEXT]), info_from_dict(meta["data_info"])
        preprocess, step = meta.get("preprocess", {}), int(meta["step"])
    return Trained(config=config, info=info, preprocess=preprocess, weights=load_weights(path / MODEL_FILE),
                   step=step, source=path, base=meta.get("base"))


@contextlib.contextmanager
def fields_of(file: Path) -> Iterator[None]:
    """Turn a missing or mistyped field of `file` into a UserError naming the file (no traceback)."""
    try:
        yield
    except UserError:
        raise
    except BadField as e:
        raise UserError(f"{file}: {e}; restore it or re-run training") from None
    except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: int(inf)
        raise UserError(f"{file}: missing or malformed field ({type(e).__name__}: {e}); restore it or re-run training") from None
