"""`data.normalize: model`: images resized, cropped and normalized as the pretrained model's own library does it
(timm's data config, torchvision weights' transforms(), a transformers image processor), stored with the run and
served the same way. Nothing is downloaded: timm and torchvision give their preprocessing as metadata, and the
transformers model is a tiny one saved here."""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainforge.cli import main
from trainforge.compression import artifact
from trainforge.compression.serving import modality_reader
from trainforge.config import Config, DataConfig, FromModelConfig, load_config
from trainforge.data.image.preprocess import ImagePreprocess
from trainforge.data.stages.normalize import Normalizer
from trainforge.data.pipeline import build_data
from trainforge.errors import UserError

SIZES = [(30, 40), (41, 33), (50, 50), (37, 61)]  # (height, width): landscape, portrait, square, odd margins
MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.3, 0.25]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("normalize_model") / "images"
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i, (h, w) in enumerate(SIZES):
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def model_data(images: Path, family: str, source: str, weights: str | None = None, **fields) -> DataConfig:
    return DataConfig(source="imagefolder", path=str(images), normalize="model", val_fraction=0.25, test_fraction=0,
                      from_model=FromModelConfig(family=family, source=source, weights=weights), **fields)


def max_diff_to(bundle, transform) -> float:
    """The largest difference over every sample of every split between the pipeline and `transform(file)`."""
    worst = 0.0
    for split in (bundle.train, bundle.val):
        for i in range(len(split)):
            path = split.samples.paths[int(split.indices[i])]
            with Image.open(path) as img:
                expected = torch.as_tensor(np.asarray(transform(img)))
            x = split[i][0]
            assert x.shape == expected.shape == bundle.info.input_shape, (x.shape, expected.shape)
            worst = max(worst, float((x - expected).abs().max()))
    return worst


@pytest.mark.parametrize("arch", ["test_resnet", "resnet10t"])  # bilinear crop_pct 0.95; bicubic crop_pct 0.875
def test_timm_images_are_timms_eval_transform(images, arch):
    import timm
    from timm.data import create_transform, resolve_data_config

    bundle = build_data(model_data(images, "timm", arch), seed=0)
    config = resolve_data_config({}, model=timm.create_model(arch, pretrained=False))
    transform = create_transform(**config)  # the eval transform
    assert max_diff_to(bundle, lambda img: transform(img.convert("RGB"))) <= 1e-5  # measured: 0 (bit-identical)
    assert bundle.info.input_shape == config["input_size"]
    assert bundle.report["normalization"]["kind"] == "model"
    assert bundle.report["image_preprocess"]["origin"] == f"timm {arch} data config"


def test_torchvision_images_are_the_weights_transforms(images):
    from torchvision.models import ResNet18_Weights

    transform = ResNet18_Weights.DEFAULT.transforms()  # metadata only: no weights are downloaded
    bundle = build_data(model_data(images, "torchvision", "resnet18", "DEFAULT"), seed=0)
    assert max_diff_to(bundle, lambda img: transform(img.convert("RGB"))) <= 1e-5  # measured: 0
    assert bundle.info.input_shape == (3, 224, 224)
    assert bundle.preprocess["image_preprocess"]["origin"] == "torchvision ResNet18_Weights.IMAGENET1K_V1"


def test_tensor_sources_are_resized_with_torchvision_to_the_same_result():
    """synthetic_images holds tensors: resized and cropped with torchvision's tensor ops, as transforms() does them."""
    from torchvision.models import ResNet18_Weights

    cfg = DataConfig(source="synthetic_images", args={"num_samples": 8, "image_size": 20}, normalize="model",
                     from_model=FromModelConfig(family="torchvision", source="resnet18", weights="DEFAULT"))
    bundle = build_data(cfg, seed=0)
    raw = build_data(cfg.model_copy(update={"normalize": "none", "from_model": None}), seed=0)
    transform = ResNet18_Weights.DEFAULT.transforms()
    x, expected = bundle.val[0][0], transform(raw.val[0][0])
    assert x.shape == (3, 224, 224) == bundle.info.input_shape
    assert float((x - expected).abs().max()) <= 1e-5  # measured: 0


def test_a_torchvision_dataset_is_resized_from_its_pil_images(tmp_path):
    import torchvision
    from torchvision.models import ResNet18_Weights

    kwargs = {"size": 4, "image_size": [3, 30, 40], "num_classes": 2}
    cfg = DataConfig(source="torchvision", args={"name": "FakeData", "root": str(tmp_path), "kwargs": kwargs},
                     normalize="model", val_fraction=0, test_fraction=0,
                     from_model=FromModelConfig(family="torchvision", source="resnet18", weights="DEFAULT"))
    bundle = build_data(cfg, seed=0)
    fake = torchvision.datasets.FakeData(size=4, image_size=(3, 30, 40), num_classes=2)
    transform = ResNet18_Weights.DEFAULT.transforms()
    for i in range(len(bundle.train)):
        index = int(bundle.train.indices[i])
        assert torch.equal(bundle.train[i][0], transform(fake[index][0]))  # measured: bit-identical


def test_gray_digits_become_three_channels_on_their_own_pixel_scale():
    cfg = DataConfig(source="digits", normalize="model", from_model=FromModelConfig(family="timm", source="test_resnet"))
    bundle = build_data(cfg, seed=0)
    x = bundle.val[0][0]
    assert x.shape == (3, 160, 160) == bundle.info.input_shape
    assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])
    # digits are ink counts 0..16: the model's mean and std (of [0, 1] pixels) are applied on that scale
    assert bundle.preprocess["normalize"] == {"kind": "model", "mean": [8.0] * 3, "std": [8.0] * 3}
    assert float(x.min()) >= -1 - 1e-5 and float(x.max()) <= 1 + 1e-5


# ---- transformers: a tiny ViT with its image processor, saved as the hub ships them ---------------------------


def save_tiny_vit(path: Path, processor) -> Path:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, num_labels=2)
    ViTForImageClassification(config).save_pretrained(path)
    processor.save_pretrained(path)
    return path


def processors():
    from transformers import CLIPImageProcessor, ConvNextImageProcessor, ViTImageProcessor

    return {
        "vit": ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=MEAN, image_std=STD),  # a warp
        "clip": CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                   image_mean=MEAN, image_std=STD),  # shorter side, then a centre crop
        "convnext": ConvNextImageProcessor(size={"shortest_edge": 32}, crop_pct=0.875, image_mean=MEAN,
                                           image_std=STD),  # its own rule: shorter side to 32 / 0.875, crop 32
    }


@pytest.mark.parametrize("kind", ["vit", "clip", "convnext"])
def test_hf_images_are_the_image_processors_pixel_values(images, tmp_path, kind):
    from transformers import AutoImageProcessor

    model_dir = save_tiny_vit(tmp_path / kind, processors()[kind])
    bundle = build_data(model_data(images, "hf", str(model_dir)), seed=0)
    assert bundle.info.input_shape == (3, 32, 32)
    for backend, tolerance in (("pil", 1e-5), ("torchvision", 1.0001 / 255 / min(STD))):
        proc = AutoImageProcessor.from_pretrained(model_dir, backend=backend)
        diff = max_diff_to(bundle, lambda img: proc(img, return_tensors="np")["pixel_values"][0])
        # measured: 0 against the PIL backend (the same Pillow resize); the torchvision backend resizes 8-bit
        # tensors with its own antialiasing, at most one grey level (1/255) away: 0.0196 here (std 0.2)
        assert diff <= tolerance, (backend, diff)


def test_the_stored_preprocessing_is_used_without_the_model_and_served_alike(images, tmp_path):
    model_dir = save_tiny_vit(tmp_path / "vit", processors()["clip"])
    cfg = model_data(images, "hf", str(model_dir))
    bundle = build_data(cfg, seed=0)
    assert bundle.preprocess["image_preprocess"] == {
        "resize_size": [32], "crop_size": [32, 32], "crop_rounding": "floor", "interpolation": "bicubic",
        "mean": MEAN, "std": STD, "origin": f"hf {model_dir} CLIPImageProcessor"}
    shutil.rmtree(model_dir)
    with pytest.raises(UserError, match="data.from_model.source"):
        build_data(cfg, seed=0)  # without the record the model's processor is needed, and it is gone
    again = build_data(cfg, seed=0, stored=bundle.preprocess)
    for split, same in ((bundle.train, again.train), (bundle.val, again.val)):
        for i in range(len(split)):
            assert torch.equal(split[i][0], same[i][0])
    norm = Normalizer.from_json(bundle.preprocess["normalize"], (-1, 1, 1))
    assert norm.kind == "model" and norm.to_json() == bundle.preprocess["normalize"]
    # predict's torch-free reader: the same array as the training pipeline, bit for bit
    meta = artifact.artifact_meta("fp32", bundle.info, bundle.preprocess)
    path = bundle.val.samples.paths[int(bundle.val.indices[0])]
    ((_, served),) = list(modality_reader({**meta, "modality": "image"}, "model.onnx")([path]))
    assert served.dtype == np.float32 and np.array_equal(served, bundle.val[0][0].numpy())


def test_a_damaged_image_preprocess_record_is_one_line_when_served(images):
    bundle = build_data(model_data(images, "timm", "test_resnet"), seed=0)
    meta = artifact.artifact_meta("fp32", bundle.info, bundle.preprocess)
    meta["preprocess"]["image_preprocess"]["crop_size"] = [160]
    with pytest.raises(UserError, match="model.onnx: its image_preprocess metadata is damaged"):
        modality_reader({**meta, "modality": "image"}, "model.onnx")
    meta["preprocess"]["image_preprocess"]["crop_size"] = [100, 100]
    with pytest.raises(UserError, match=r"gives \[3, 100, 100\] inputs, the model takes \[3, 160, 160\]"):
        modality_reader({**meta, "modality": "image"}, "model.onnx")


def test_augmentation_works_behind_the_resize(images):
    cfg = model_data(images, "timm", "test_resnet", augment={"crop_scale": (0.5, 1.0), "rotation_deg": 20})
    bundle = build_data(cfg, seed=0)
    plain, augmented = bundle.train[0][0], bundle.train[(0, 0)][0]
    assert augmented.shape == plain.shape == (3, 160, 160)
    assert not torch.equal(augmented, plain)
    assert torch.equal(augmented, bundle.train[(0, 0)][0])  # a function of (seed, epoch, index)


def test_a_torchvision_weights_file_takes_the_default_transforms_and_says_so(images, tmp_path):
    bundle = build_data(model_data(images, "torchvision", "resnet18", str(tmp_path / "weights.pth")), seed=0)
    note = bundle.report["image_preprocess"]
    assert note["origin"] == "torchvision ResNet18_Weights.IMAGENET1K_V1"
    assert note["note"] == "weights from a file: the transforms of resnet18's DEFAULT weight set"
    assert note["input_shape"] == [3, 224, 224]


def test_image_size_is_the_models_and_an_explicit_one_is_reported_ignored(images):
    with pytest.warns(UserWarning, match=r"data.args.image_size ignored: .* model's 160x160"):
        bundle = build_data(model_data(images, "timm", "test_resnet", args={"image_size": 16}), seed=0)
    assert bundle.info.input_shape == (3, 160, 160) and bundle.preprocess["image_size"] == 160


# ---- config -------------------------------------------------------------------------------------------------


def test_the_model_section_fills_data_from_model():
    cfg = Config.model_validate({"data": {"normalize": "model"},
                                 "model": {"name": "resnet", "args": {"arch": "resnet18", "weights": "DEFAULT"}}})
    assert cfg.data.from_model == FromModelConfig(family="torchvision", source="resnet18", weights="DEFAULT")
    cfg = Config.model_validate({"data": {"normalize": "model"}, "model": {"name": "timm", "args": {"arch": "test_vit"}}})
    assert cfg.data.from_model == FromModelConfig(family="timm", source="test_vit")


def test_normalize_model_with_the_zoos_cnn_is_one_config_error(capsys):
    with pytest.raises(UserError, match=r"^data.normalize: 'model' needs a pretrained model .*'cnn'.*data.from_model"):
        load_config(None, ["data.normalize=model", "model.name=cnn"])
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "data.normalize=model", "model.name=cnn", "--json"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "data.normalize" in err and len(err.strip().splitlines()) == 1, err


def test_tabular_data_refuses_and_text_data_ignores_normalize_model(tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))
    timm_model = FromModelConfig(family="timm", source="test_resnet")
    with pytest.raises(UserError, match="data.normalize: 'model' does not apply: .* tabular data"):
        build_data(DataConfig(source="csv", path=str(csv), normalize="model",
                              from_model=timm_model), seed=0)
    text = DataConfig(source="synthetic_text", args={"num_samples": 16}, normalize="model", from_model=timm_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_data(text, seed=0)
    assert any("data.normalize: model ignored" in str(w.message) for w in caught)


def test_a_record_round_trips():
    spec = ImagePreprocess((36,), (32, 32), "bicubic", (0.4, 0.5, 0.6), (0.2, 0.3, 0.25), "x", "floor")
    assert ImagePreprocess.from_json(spec.to_json()) == spec
    assert spec.resized_hw(30, 40) == (36, 48) and spec.resized_hw(41, 33) == (44, 36)
