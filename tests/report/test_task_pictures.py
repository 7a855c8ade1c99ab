"""The validation picture a task draws (Evaluation.picture), which the run report embeds: a detector's true boxes in
green and its predictions in red on the first images; a segmenter's image, true and predicted masks side by side."""
from __future__ import annotations

import numpy as np
import torch

from trainforge.data.base import DataInfo
from trainforge.tasks import TASKS

DET = DataInfo("detection", "image", (3, 64, 64), "float32", 3, ("__background__", "box", "disc"))
SEG = DataInfo("segmentation", "image", (3, 32, 32), "float32", 3, ("background", "box", "disc"))


def test_a_detectors_picture_draws_true_boxes_green_and_confident_predictions_red():
    evaluation = TASKS.get("detection").evaluation(DET)
    images = torch.zeros(10, 3, 64, 64)
    true = {"boxes": torch.tensor([[4.0, 4.0, 20.0, 20.0]]), "labels": torch.tensor([1])}
    found = {"boxes": torch.tensor([[32.0, 32.0, 60.0, 60.0], [4.0, 40.0, 12.0, 60.0]]),
             "scores": torch.tensor([0.9, 0.1]), "labels": torch.tensor([2, 1])}  # the second scores too low to show
    evaluation.add_batch([found] * 10, (images, [true] * 10))
    picture = evaluation.picture()
    tile = 256 + 4  # 8 images of 64 px drawn at 256 px, 4 a row, 4 px apart
    assert picture.dtype == np.uint8 and picture.shape == (4 + 2 * tile, 4 + 4 * tile, 3)
    first = picture[4:4 + 256, 4:4 + 256]
    assert tuple(first[16, 40]) == (0, 255, 0)  # the true box's top edge (y 4 -> 16), in lime
    assert tuple(first[128, 160]) == (255, 0, 0)  # the prediction's top edge (y 32 -> 128), in red
    assert not (first[160:240, 16:48] == (255, 0, 0)).all(axis=-1).any()  # the 0.1 box is not drawn


def test_a_segmenters_picture_is_image_true_and_predicted_masks_in_a_row_each():
    evaluation = TASKS.get("segmentation").evaluation(SEG)
    images = torch.rand(6, 3, 32, 32)
    masks = torch.zeros(6, 32, 32, dtype=torch.long)
    masks[:, :16] = 1
    masks[:, -2:] = 255  # unlabelled
    logits = torch.zeros(6, 3, 32, 32)
    logits[:, 2] = 1.0  # everything predicted "disc"
    evaluation.add_batch(logits, (images, masks))
    picture = evaluation.picture()
    side = 192
    assert picture.shape == (4 * side + 3 * 4, 3 * side + 2 * 4, 3)  # the first 4 images, a row each
    true, predicted = picture[:side, side + 4:2 * side + 4], picture[:side, 2 * side + 8:]
    assert tuple(true[10, 10]) == (128, 0, 0) and tuple(true[100, 10]) == (0, 0, 0)  # VOC colours of 1 and 0
    assert tuple(true[-1, 10]) == (255, 255, 255)  # unlabelled pixels white
    assert (predicted == (0, 128, 0)).all()  # class 2 everywhere
