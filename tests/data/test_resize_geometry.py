"""Issue 55: detection and segmentation fit an image to the model's input as `data.args.resize` says (keep_aspect, the
default; letterbox; stretch), and the boxes and masks the model is fed follow the pixels exactly; what the model
answers maps back to the file's pixels (trainforge/geometry.py)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.geometry import fit_image, fit_mask, mask_to_file, read_fitted, to_file, to_model
from vision_data import write_masks, write_shapes

HEIGHT, WIDTH, SIZE = 32, 96, 48  # 3:1 frames, fitted to a 48-pixel side
SHAPES = {"keep_aspect": (3, 16, 48), "letterbox": (3, 48, 48), "stretch": (3, 48, 48)}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    root = tmp_path_factory.mktemp("wide")
    truth = write_shapes(root, n=24, side=HEIGHT, width=WIDTH, seed=3, formats=("coco", "yolo"))
    write_masks(root / "masks", n=12, side=HEIGHT, width=WIDTH, seed=4)
    return root, {file: np.asarray(boxes, np.float64) for file, boxes, _ in truth}


def bundle(root, source: str, mode: str, **args):
    overrides = [f"data.source={source}", f"data.path={root / source}", "data.normalize=none", "data.augment={}",
                 f"data.args={{image_size: {SIZE}, resize: {mode}{''.join(f', {k}: {v}' for k, v in args.items())}}}"]
    cfg = load_config("coco_detection_finetune" if source != "masks" else "segmentation_finetune", overrides)
    return build_data(cfg.data, seed=0, fit_stats=False)


@pytest.mark.parametrize("source", ["coco", "yolo"])
@pytest.mark.parametrize("mode", list(SHAPES))
def test_the_boxes_fed_to_the_model_are_the_annotations_moved_with_the_pixels(wide, source, mode):
    root, truth = wide
    data = bundle(root, source, mode)
    assert data.report["resize"] == mode and data.preprocess["resize"] == mode
    assert data.info.input_shape == (3, SIZE, SIZE)  # the largest input the setting allows: what the planner sizes
    split = data.train
    for i in range(len(split)):
        image, target = split[i]
        file = split.samples.ids[int(split.indices[i])]
        assert tuple(image.shape) == SHAPES[mode]
        scale_x, scale_y = (SIZE / WIDTH, SIZE / HEIGHT) if mode == "stretch" else (SIZE / WIDTH, SIZE / WIDTH)
        top = (SIZE - HEIGHT * SIZE / WIDTH) / 2 if mode == "letterbox" else 0.0
        want = truth[file] * [scale_x, scale_y, scale_x, scale_y] + [0, top, 0, top]
        assert np.abs(target["boxes"].numpy() - want).max() <= 1e-4, (file, target["boxes"], want)


def test_keep_aspect_is_the_default_and_square_images_are_what_stretch_gave(tmp_path):
    write_shapes(tmp_path, n=6, side=40, seed=1, formats=("coco",))
    overrides = ["data.source=coco", f"data.path={tmp_path / 'coco'}", "data.normalize=none", "data.augment={}",
                 "data.args.image_size=32"]
    kept = build_data(load_config("coco_detection_finetune", overrides).data, seed=0, fit_stats=False)
    stretched = build_data(load_config("coco_detection_finetune", [*overrides, "data.args.resize=stretch"]).data,
                           seed=0, fit_stats=False)
    assert kept.report["resize"] == "keep_aspect"
    for i in range(len(kept.train)):  # a square image fits the same either way: recipes on square data keep their numbers
        (a, ta), (b, tb) = kept.train[i], stretched.train[i]
        assert np.array_equal(a.numpy(), b.numpy()) and np.array_equal(ta["boxes"].numpy(), tb["boxes"].numpy())


@pytest.mark.parametrize("mode", list(SHAPES))
def test_a_masks_canvas_is_one_size_and_its_padding_is_no_class(wide, mode):
    root, _ = wide
    data = bundle(root, "masks", mode, classes="[background, box, disc]")
    for i in range(len(data.val)):
        image, mask = data.val[i]
        assert tuple(image.shape) == (3, SIZE, SIZE) and tuple(mask.shape) == (SIZE, SIZE)
        file = data.val.samples.masks[int(data.val.indices[i])]
        with Image.open(root / "masks" / "masks" / file) as m:
            original = np.asarray(m)
        fit = fit_image(WIDTH, HEIGHT, SIZE, mode, pad=True)
        if mode != "stretch":  # outside the image: no class (255), never a class the loss would learn
            inside = np.zeros((SIZE, SIZE), bool)
            inside[fit.top:fit.top + fit.height, fit.left:fit.left + fit.width] = True
            assert (mask.numpy()[~inside] == 255).all()
        assert np.array_equal(mask.numpy(), fit_mask(original, fit, 255))


@pytest.mark.parametrize("mode", list(SHAPES))
def test_answers_map_back_to_the_files_pixels(tmp_path, mode):
    frame = np.random.default_rng(0).integers(0, 255, (375, 1242, 3), dtype=np.uint8)  # a KITTI camera frame
    Image.fromarray(frame).save(tmp_path / "frame.png")
    x, fit = read_fitted(str(tmp_path / "frame.png"), 640, mode)
    assert x.shape[1:] == {"keep_aspect": (193, 640), "letterbox": (640, 640), "stretch": (640, 640)}[mode]
    boxes = np.asarray([[0, 0, 1242, 375], [100.5, 20.25, 400, 300]], np.float32)
    assert np.abs(to_file(to_model(boxes, fit), fit) - boxes).max() < 1e-3
    mask = np.zeros((375, 1242), np.uint8)
    mask[100:200, 300:700] = 1
    canvas = fit_mask(mask, fit, 255)
    assert canvas.shape == (x.shape[1], x.shape[2])
    back = mask_to_file(canvas, fit)
    assert back.shape == mask.shape and (back == mask).mean() > 0.99  # nearest neighbour both ways
