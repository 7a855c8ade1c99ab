"""The task each data source's data is for when neither the recipe (`task:`) nor the source's args say otherwise.
Torch-free: `trainforge recipes` reads it without importing the sources; tests/data/test_source_tasks.py holds it
to what each source builds."""
from __future__ import annotations

from typing import Any, Optional

SOURCE_TASK = {
    "chat": "lm",
    "coco": "detection",  # chat SFT: next-token targets on the assistant's turns
    "csv": "classification",
    "custom": None,  # the user's factory (data.target) decides
    "digits": "classification",
    "hf_datasets": "lm",  # data.args.label_column set: classification
    "imagefolder": "classification",
    "jsonl": "classification",
    "kitti": "detection3d",
    "masks": "segmentation",
    "multimodal": "classification",
    "pointclouds": "detection3d",
    "synthetic_images": "classification",
    "synthetic_text": "classification",  # data.args.task: lm
    "textfile": "lm",
    "torchvision": "classification",
    "voc": "detection",
    "volumes": "classification",  # data.args.mask_column: segmentation
    "webdataset": "classification",
    "yolo": "detection",
}


def recipe_task(recipe: dict[str, Any]) -> Optional[str]:
    """The task a recipe (as parsed YAML) trains, from the file alone: its `task:`, else what its data source makes
    by default (synthetic_text's data.args.task, hf_datasets' data.args.label_column); None when its code decides."""
    if recipe.get("task"):
        return str(recipe["task"])
    data = recipe.get("data") or {}
    args = data.get("args") or {}
    source = data.get("source", "digits")
    if source == "synthetic_text" and args.get("task"):
        return str(args["task"])
    if source == "hf_datasets" and args.get("label_column"):
        return "classification"
    if source == "volumes" and args.get("mask_column"):
        return "segmentation"
    return SOURCE_TASK.get(source)
