"""Normalization fitted on train only; augmentation as a pure function of (seed, epoch, index)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_helpers import data_cfg
from trainforge.config import AugmentConfig
from trainforge.data import build_data
from trainforge.data.stages.augment import build_augment, crop_box
from trainforge.data.stages.normalize import Normalizer, fit_normalizer
from trainforge.data.seeding import derive_seed, generator_for

ALL_AUGMENTS = {"rotation_deg": 30, "crop_scale": [0.5, 1.0], "hflip": 0.5, "vflip": 0.5, "color_jitter": 0.4}


def test_zscore_stats_come_from_the_train_split_only(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("f,g,label\n" + "".join(f"{i},{i * i % 7},{i % 2}\n" for i in range(100)))
    bundle = build_data(data_cfg("csv", path=str(path)), seed=0)
    raw = bundle.train.samples.x[torch.as_tensor(bundle.train.indices)].double()
    stats = bundle.preprocess["normalize"]
    np.testing.assert_allclose(stats["mean"], raw.mean(0).tolist(), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], raw.std(0, unbiased=False).tolist(), rtol=1e-9)
    everything = bundle.train.samples.x.double()
    assert not np.allclose(stats["mean"], everything.mean(0).tolist())  # val/test rows did not leak in
    assert bundle.report["normalization"] == {**stats, "constant_feature_names": []}
    xs = torch.stack([bundle.train[(0, i)][0] for i in range(len(bundle.train))])
    torch.testing.assert_close(xs.mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(xs.std(0, unbiased=False), torch.ones(2), atol=1e-5, rtol=0)


def test_image_zscore_is_per_channel_and_minmax_maps_train_to_unit_range():
    cfg = data_cfg("synthetic_images", args={"num_samples": 100, "image_size": 4, "channels": 2, "num_classes": 2})
    z = build_data(cfg, seed=0)
    assert len(z.preprocess["normalize"]["mean"]) == 2 and z.preprocess["channels"] == 2
    mm = build_data(cfg.model_copy(update={"normalize": "minmax"}), seed=0)
    xs = torch.stack([mm.train[(0, i)][0] for i in range(len(mm.train))])
    assert xs.amin(dim=(0, 2, 3)).tolist() == pytest.approx([0, 0], abs=1e-6)
    assert xs.amax(dim=(0, 2, 3)).tolist() == pytest.approx([1, 1], abs=1e-6)
    none = build_data(cfg.model_copy(update={"normalize": "none"}), seed=0)
    assert none.preprocess["normalize"] == {"kind": "none"}
    assert torch.equal(none.val[0][0], none.val.samples[int(none.val.indices[0])][0])


def test_std_floor_and_json_round_trip():
    batch = torch.ones(5, 3, 2, 2)
    batch[:, 0] = 0.0
    batch[:, 0, 0, 0] = torch.arange(5) * 1e-9  # a tiny but real spread: std floored at 1e-6
    norm = fit_normalizer("zscore", [batch[:2], batch[2:]], (-1, 1, 1))
    assert norm.to_json()["std"] == [1e-6, 1.0, 1.0] and norm.to_json()["constant_features"] == [1, 2]
    again = Normalizer.from_json(norm.to_json(), (-1, 1, 1))
    x = torch.randn(3, 2, 2)
    torch.testing.assert_close(again(x), norm(x))


@pytest.mark.parametrize("kind", ["zscore", "minmax"])
def test_a_feature_constant_in_train_is_only_centred(kind):
    """Regression: a constant train feature was divided by the 1e-6 floor, so 2.0 in validation became 1e6."""
    train = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 4.0]])
    norm = fit_normalizer(kind, [train[:2], train[2:]], (-1,))
    assert norm.to_json()["constant_features"] == [0]
    assert norm(train)[:, 0].tolist() == [0.0] * 4
    val = torch.tensor([2.0, 3.0])
    assert norm(val)[0].item() == 1.0  # centred only: 2.0 - 1.0, scale 1
    again = Normalizer.from_json(json.loads(json.dumps(norm.to_json())), (-1,))
    assert torch.equal(again(val), norm(val))
    # a large constant value: sums of squares are not exactly 0, min == max is
    big = fit_normalizer(kind, [torch.full((7, 1), 123456.7)], (-1,))
    assert big.to_json()["constant_features"] == [0] and big(torch.tensor([123457.7])).item() == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["zscore", "minmax"])
def test_the_data_report_lists_constant_features(tmp_path, kind):
    path = tmp_path / "t.csv"
    path.write_text("f,const,g,label\n" + "".join(f"{i},7.5,{i % 3},{i % 2}\n" for i in range(40)))
    bundle = build_data(data_cfg("csv", path=str(path), normalize=kind), seed=0)
    norm = bundle.report["normalization"]
    assert norm["constant_features"] == [1] and norm["constant_feature_names"] == ["const"]
    assert bundle.preprocess["normalize"]["constant_features"] == [1]
    assert all(bundle.val[i][0][1].item() == 0.0 for i in range(len(bundle.val)))


def test_lazy_sources_fit_on_at_most_2000_samples(monkeypatch):
    import trainforge.data.pipeline as pipeline

    seen = []
    real = pipeline.fit_normalizer

    def spy(kind, batches, view):
        batches = list(batches)
        seen.append(sum(len(b) for b in batches))
        return real(kind, batches, view)

    monkeypatch.setattr(pipeline, "fit_normalizer", spy)
    monkeypatch.setattr(pipeline, "MAX_STATS_SAMPLES", 50)
    build_data(data_cfg("synthetic_images", args={"num_samples": 400, "image_size": 2}), seed=0)
    assert seen == [50]


def image_bundle(**augment):
    cfg = data_cfg("synthetic_images", args={"num_samples": 64, "image_size": 12, "channels": 3}, augment=augment)
    return build_data(cfg, seed=7)


def test_augmentation_is_a_function_of_seed_epoch_index():
    bundle = image_bundle(**ALL_AUGMENTS)
    rng_before = torch.get_rng_state()
    a = bundle.train[(2, 5)][0]
    b = bundle.train[(2, 5)][0]
    assert torch.get_rng_state().equal(rng_before), "the global torch RNG must not be touched"
    assert torch.equal(a, b)
    assert not torch.equal(a, bundle.train[(3, 5)][0]), "a new epoch must draw new augmentation"
    assert not torch.equal(a, bundle.train[(2, 6)][0])
    torch.manual_seed(123)  # the global RNG state has no influence either
    assert torch.equal(a, bundle.train[(2, 5)][0])
    # val/test are never augmented; an int index into train gives the plain sample (train-split eval)
    plain = image_bundle()
    assert torch.equal(bundle.val[0][0], plain.val[0][0])
    assert torch.equal(bundle.train[5][0], plain.train[(2, 5)][0])


@pytest.mark.parametrize("op", list(ALL_AUGMENTS))
def test_each_augmentation_changes_train_samples(op):
    bundle = image_bundle(**{op: ALL_AUGMENTS[op] if op not in ("hflip", "vflip") else 1.0})
    plain = image_bundle()
    assert bundle.train.augment is not None and plain.train.augment is None
    changed = sum(not torch.equal(bundle.train[(0, i)][0], plain.train[(0, i)][0]) for i in range(8))
    assert changed >= 6


def test_flips_are_exact_and_jitter_respects_the_raw_scale():
    x = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)
    hflip = build_augment(AugmentConfig(hflip=1.0), channels=2, value_range=(0.0, 17.0))
    assert torch.equal(hflip(x, generator_for("t")), x.flip(-1))
    vflip = build_augment(AugmentConfig(vflip=1.0), channels=2, value_range=(0.0, 17.0))
    assert torch.equal(vflip(x, generator_for("t")), x.flip(-2))
    digits = torch.linspace(0, 16, 64).reshape(1, 8, 8)
    jitter = build_augment(AugmentConfig(color_jitter=0.5), channels=1, value_range=(0.0, 16.0))
    out = jitter(digits, generator_for("t", 1))
    assert out.max() <= 16 + 1e-5 and out.max() > 4, "jitter must work on 0..16 digits, not clip them to 1"
    assert build_augment(AugmentConfig(), channels=1, value_range=(0.0, 1.0)) is None


def test_crop_box_stays_inside_the_image():
    for i in range(50):
        top, left, h, w = crop_box(10, 14, (0.1, 1.0), generator_for("crop", i))
        assert 0 < h <= 10 and 0 < w <= 14 and top + h <= 10 and left + w <= 14


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed("augment", 0, 1, 2) == derive_seed("augment", 0, 1, 2)
    assert len({derive_seed("augment", 0, e, i) for e in range(10) for i in range(10)}) == 100
    assert derive_seed("order", 0, 1) != derive_seed("augment", 0, 1)
    # pinned: a change would silently change every stored run's data order and augmentation
    assert derive_seed("x", 1) == 2622597897832527108


def test_augment_on_text_warns_and_is_ignored():
    cfg = data_cfg("synthetic_text", args={"num_samples": 20}, augment={"hflip": 0.5})
    with pytest.warns(UserWarning, match=r"data.augment.hflip ignored: image augmentation does not apply to text"):
        bundle = build_data(cfg, seed=0)
    assert bundle.train.augment is None
