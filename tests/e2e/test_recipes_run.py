"""The built-in recipes: how each one is scaled down for a test run (SCALE_DOWN; ON_FILES for those that fine-tune a
hub model, with tiny local stand-ins: `files`), `trainforge recipes`, and the default recipe's accuracy bar. Each
recipe's run itself, through the real CLI, is test_fixed_seed_table.py's (one run a recipe serves both its row of the
table and what its files must show)."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file

from trainforge.config import builtin_recipes, load_config, resolve_recipe
from trainforge.cli import main
from trainforge.tasks import TASKS
from lidar_data import make_scenes, write_kitti
from multimodal_data import write_drives
from vision_data import MASK_CLASSES, write_masks, write_shapes
from volume_data import write_lesions, write_patients

SCALE_DOWN = {
    "digits_cnn": [],
    "digits_hybrid": [],
    "textcls_transformer": ["data.args.num_samples=200"],
    "charlm_gpt": ["data.args.max_bytes=60000", "data.args.block_size=64", "model.args.n_layer=1",
                   "train.global_batch_size=16", "train.micro_batch_size=16"],
    "resnet50_synthetic": ["data.args.num_samples=80", "data.args.image_size=64", "data.args.num_classes=10",
                           "train.global_batch_size=4", "train.micro_batch_size=2"],
    "gpt2_small_synthetic": ["data.args.num_samples=40", "data.args.seq_len=64", "model.args.block_size=64",
                             "model.args.n_layer=1", "model.args.n_embd=64", "model.args.n_head=2",
                             "train.global_batch_size=4", "train.micro_batch_size=2"],
}


# recipes that fine-tune a hub model on the user's files: run offline on tiny local stand-ins of the model
# (tests/tiny_models.py, saved with save_pretrained) and of the files, through the recipe's own settings
ON_FILES = {
    "textcls_finetune": lambda f: [f"data.path={f['reviews']}", f"model.args.pretrained={f['bert']}",
                                   "data.args.seq_len=32", "train.global_batch_size=8"],
    "causal_lm_finetune": lambda f: [f"data.path={f['docs']}", f"model.args.pretrained={f['llama']}",
                                     "data.args.block_size=32", "train.global_batch_size=4"],
    "llm_lora_sft": lambda f: [f"data.path={f['chats']}", f"model.args.pretrained={f['chat_llama']}",
                               "data.args.seq_len=64", "train.global_batch_size=2"],
    "llm_qlora_sft": lambda f: [f"data.path={f['chats']}", f"model.args.pretrained={f['chat_llama']}",
                                "data.args.seq_len=64", "train.global_batch_size=2"],
    # timm's tiny test_resnet (its data config: 160x160 crops) stands in for ConvNeXt, weights from a file
    "images_finetune": lambda f: [f"data.path={f['photos']}", "model.args.arch=test_resnet",
                                  f"model.args.pretrained={f['timm']}", "train.global_batch_size=4"],
    # the recipe's own Faster R-CNN, its "COCO weights" a state dict file of the arch saved here (random values)
    "coco_detection_finetune": lambda f: [f"data.path={f['boxes']}", f"model.args.pretrained={f['detector']}",
                                          "data.args.image_size=96", "train.global_batch_size=2"],
    # Hugging Face's DETR recipe on a tiny DETR saved with its image processor (the hub folder's layout)
    "detr_finetune": lambda f: [f"data.path={f['boxes']}", f"model.args.config={f['detr']}", "data.args.image_size=96",
                                "train.global_batch_size=2"],
    # MONAI's 3D DenseNet on generated NIfTI and DICOM volumes, split by patient; the recipe's network, smaller
    "ct_classification": lambda f: [f"data.path={f['volumes']}", "data.args.size=[64, 64, 64]",
                                    "data.args.spacing=null", "model.args.init_features=8", "model.args.growth_rate=4",
                                    "train.global_batch_size=2"],
    "ct_segmentation": lambda f: [f"data.path={f['lesions']}", "data.args.size=[16, 16, 16]", "data.args.spacing=null",
                                  "train.global_batch_size=2"],
    "fusion_classifier": lambda f: [f"data.path={f['drives']}", "data.args.image_size=16",
                                    "train.global_batch_size=4"],
    # PointPillars on generated drives in KITTI's layout, a coarse grid and a small network
    "pointpillars_kitti": lambda f: [f"data.path={f['lidar']}", "data.args.max_points_per_voxel=8",
                                     "data.args.point_cloud_range=[0, -25.6, -3, 40.96, 25.6, 1]",
                                     "data.args.voxel_size=[0.64, 0.64, 4]",
                                     "data.args.max_voxels=[3000, 4000]", "train.global_batch_size=2",
                                     "model.args={pillar_channels: 16, channels: [16, 32, 32], layers: [1, 1, 1], "
                                     "up_channels: 16, head_channels: 16}"],
    "segmentation_finetune": lambda f: [f"data.path={f['masks']}", f"model.args.pretrained={f['segmenter']}",
                                        f"data.args.classes=[{', '.join(MASK_CLASSES)}]", "data.args.image_size=64",
                                        "train.global_batch_size=2"],
}


def test_every_recipe_has_a_scaled_down_run():
    assert set(SCALE_DOWN) | set(ON_FILES) == set(builtin_recipes())
    assert not set(SCALE_DOWN) & set(ON_FILES)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    from tiny_models import corpus, save_tiny_bert, save_tiny_detr, save_tiny_llama

    root = tmp_path_factory.mktemp("files")
    texts = corpus(120)
    reviews = root / "reviews.jsonl"
    reviews.write_text("".join(json.dumps({"text": t, "label": "warm" if "red" in t else "cold"}) + "\n"
                               for t in texts))
    docs = root / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"doc{i}.txt").write_text("\n".join(texts[i * 40:(i + 1) * 40]))
    photos = root / "photos"
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (photos / label).mkdir(parents=True)
        for i in range(10):  # photos of different sizes and shapes, as a phone folder has
            h, w = int(rng.integers(120, 260)), int(rng.integers(120, 260))
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(photos / label / f"{i}.jpg")
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t[:20]},
                                                      {"role": "assistant", "content": t[20:]}]}) + "\n"
                             for t in texts[:40]))
    template = ("{% for m in messages %}{{ m['role'] + '\\n' + m['content'] + eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'assistant\\n' }}{% endif %}")
    weights = root / "test_resnet.safetensors"
    torch.manual_seed(0)
    save_file(timm.create_model("test_resnet", pretrained=False).state_dict(), str(weights))
    write_shapes(root / "shapes", n=16, side=96, seed=0, formats=("coco",))
    detector = root / "fasterrcnn_mobilenet_v3_large_fpn.pth"
    torch.save(torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_fpn", weights=None,
                                            weights_backbone=None).state_dict(), detector)
    write_masks(root / "masks", n=16, side=64, seed=0)
    volumes = write_patients(root / "volumes", patients=6, size=16, seed=0)
    lesions = write_lesions(root / "lesions", patients=6, size=16, seed=0)
    drives = write_drives(root / "drives", 40, seed=0, missing_images=2)
    segmenter = root / "deeplabv3_mobilenet_v3_large.pth"
    torch.save(torchvision.models.get_model("deeplabv3_mobilenet_v3_large", weights=None, weights_backbone=None,
                                            aux_loss=True).state_dict(), segmenter)  # as torchvision's file: an aux head
    return {"reviews": reviews, "docs": docs, "bert": save_tiny_bert(root / "bert"), "boxes": root / "shapes" / "coco",
            "detector": detector, "detr": save_tiny_detr(root / "detr"), "masks": root / "masks", "segmenter": segmenter,
            "volumes": volumes, "lesions": lesions, "drives": drives, "llama": save_tiny_llama(root / "llama"), "photos": photos, "timm": weights, "chats": chats,
            "chat_llama": save_tiny_llama(root / "chat_llama", chat_template=template),
            "lidar": write_kitti(root / "kitti", make_scenes(12, seed=0))}


def test_recipes_command_lists_every_recipe(capsys):
    with pytest.raises(SystemExit):
        main(["recipes", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(builtin_recipes())
    assert all({"name", "path", "command", "task", "description"} <= set(r) for r in rows)  # a contract: add only
    assert all(r["task"] in TASKS and r["description"] for r in rows)
    assert [r["command"] for r in rows] == [f"trainforge train {r['name']}" for r in rows]


def test_every_shown_command_runs_from_another_directory(capsys, monkeypatch, tmp_path):
    """A command copied from `trainforge recipes` must work wherever the user is, not just in the repo root."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["recipes", "--json"])
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        program, command, recipe, *rest = shlex.split(row["command"])
        assert (program, command, rest) == ("trainforge", "train", [])
        assert resolve_recipe(recipe).resolve() == Path(row["path"]).resolve()
        assert load_config(recipe).name  # the recipe loads and validates from here
    with pytest.raises(SystemExit):
        main(["recipes"])
    table = capsys.readouterr().out
    assert all(row["command"] in table for row in rows) and "recipes/" not in table


@pytest.mark.serial
@pytest.mark.slow
def test_default_recipe_reaches_97_percent_within_5_minutes(tmp_path):
    """Acceptance: `trainforge train` with no recipe, on CPU, >= 97% test accuracy in under 5 minutes."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "--run-dir", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    elapsed_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["eval"]["accuracy"] >= 0.97
    assert elapsed_s < 300
    assert "ETA" in proc.stderr and "samples/s" in proc.stderr  # the progress bar was shown
    for name in ("config.yaml", "metrics.jsonl", "data_report.json", "checkpoints/latest", "final/model.safetensors",
                 "final/model.json", "eval.json", "report.html"):
        assert (tmp_path / "run" / name).exists(), name
