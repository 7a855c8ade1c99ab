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
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from safetensors.torch import save_file
from torch import nn

from trainforge.config import Config, config_from_yaml_text
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.integrity import MANIFEST_FILE, NO_VERIFY, check_files, read_digests, write_manifest
from trainforge.training.checkpoint import (
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

FORMAT = "trainforge-model/1"
META_FILE = "model.json"
FINAL_FILES = (MODEL_FILE, META_FILE)  # what loading final/ reads, so what its manifest must vouch for


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
        if self.config.model.pruned:
            resize_to_weights(model, self.weights)
        load_model_weights(model, self.weights)
        return model


def info_to_dict(info: DataInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


def info_from_dict(d: dict[str, Any]) -> DataInfo:
    d = dict(d)
    d["input_shape"] = tuple(d["input_shape"])
    d["class_names"] = tuple(d.get("class_names") or ())
    return DataInfo(**d)


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
    final = run_dir / "final"
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
        "config_yaml": config.to_yaml(),
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
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    if (path / "final").is_dir():  # the run's final model, even with a file missing (verification names it)
        path = path / "final"
    if (path / META_FILE).is_file() or path.name == "final":
        if verify:
            verify_final(path)
        return read_final(path)
    if (path / "checkpoints").is_dir():
        found = find_resume_checkpoint(path / "checkpoints")
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
        config, info = config_from_yaml_text(state["config_yaml"]), info_from_dict(json.loads(state["data_info_json"]))
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
        config, info = config_from_yaml_text(meta["config_yaml"]), info_from_dict(meta["data_info"])
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
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{file}: missing or malformed field ({type(e).__name__}: {e}); restore it or re-run training") from None
