"""The trained model as an artifact: final/model.safetensors + final/model.json, and loading it back.

model.json carries everything needed to rebuild and serve the model without the original YAML:
the resolved config, the data facts (shapes, classes), the preprocessing statistics and the step.
Any of a run directory, its final/ or a checkpoints/step-* directory can be loaded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from trainforge.config import Config, config_from_yaml_text
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.training.checkpoint import (
    MODEL_FILE,
    contiguous_state,
    find_resume_checkpoint,
    is_sharded,
    load_checkpoint,
    load_model_weights,
    load_sharded_into,
    load_state,
)

FORMAT = "trainforge-model/1"


@dataclass
class Trained:
    config: Config
    info: DataInfo
    preprocess: dict[str, Any]
    weights: dict[str, torch.Tensor]
    step: int
    source: Path

    def build_model(self) -> nn.Module:
        from trainforge.models import build_model

        model, _ = build_model(self.config.model, self.info)
        if self.config.model.pruned:
            from trainforge.models.resize import resize_to_weights

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
) -> Path:
    """Write final/ atomically (temp dir, rename), replacing a previous final/."""
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
        "config_yaml": config.to_yaml(),
    }
    (tmp / "model.json").write_text(json.dumps(meta, indent=1))
    if final.exists():
        old = run_dir / f".old-final-{os.getpid()}"
        os.replace(final, old)
        shutil.rmtree(old)
    os.replace(tmp, final)
    return final


def load_trained(path: Path) -> Trained:
    """A run dir (its final model, else its newest checkpoint), a final/ dir, or a checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    if (path / "final" / "model.json").is_file():
        path = path / "final"
    if (path / "model.json").is_file():
        meta = json.loads((path / "model.json").read_text())
        if meta.get("format") != FORMAT:
            raise UserError(f"{path / 'model.json'}: not a trainforge model (format {meta.get('format')!r})")
        return Trained(
            config=config_from_yaml_text(meta["config_yaml"]),
            info=info_from_dict(meta["data_info"]),
            preprocess=meta.get("preprocess", {}),
            weights=load_file(str(path / MODEL_FILE)),
            step=int(meta["step"]),
            source=path,
        )
    if (path / "checkpoints").is_dir():
        found = find_resume_checkpoint(path / "checkpoints")
        if found is None:
            raise UserError(f"{path}: run directory has no final model and no complete checkpoint")
        path = found
    if not (path / "manifest.json").is_file():
        raise UserError(f"{path}: not a run directory, final/ or checkpoints/step-* directory")
    if is_sharded(path):  # an FSDP checkpoint: gather its shards into whole tensors in this one process
        state = load_state(path)
        config, info = config_from_yaml_text(state["config_yaml"]), info_from_dict(json.loads(state["data_info_json"]))
        from trainforge.models import build_model

        model, _ = build_model(config.model, info)
        weights = {"model": model.state_dict()}
        load_sharded_into(path, weights)
        weights = weights["model"]
    else:
        weights, state = load_checkpoint(path)
    return Trained(
        config=config_from_yaml_text(state["config_yaml"]),
        info=info_from_dict(json.loads(state["data_info_json"])),
        preprocess=json.loads(state["preprocess_json"]),
        weights=weights,
        step=int(state["step"]),
        source=path,
    )
