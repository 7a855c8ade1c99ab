"""Serving normalizes exactly as training did, constant features included (scale 1, only centred)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainforge.data.modalities.inputs import normalization, normalize
from trainforge.data.stages.normalize import Normalizer, fit_normalizer
from trainforge.errors import UserError


@pytest.mark.parametrize("kind", ["minmax", "zscore"])
def test_a_constant_train_feature_is_served_as_it_was_trained(kind):
    train = torch.tensor([[1.0, 0.0], [1.0, 2.0], [1.0, 4.0]])
    fitted = fit_normalizer(kind, [train], (-1,))
    assert fitted.stats["constant_features"] == [0]
    later = torch.tensor([[2.0, 3.0]])  # a value the train split never had in feature 0
    expected = Normalizer.from_json(fitted.to_json(), (-1,))(later).numpy()
    served = normalize(later.numpy(), normalization(fitted.to_json(), 2, (-1,), "model.onnx"))
    np.testing.assert_array_equal(served, expected)
    assert abs(served[0, 0]) < 10  # centred only: 1.0 away, not 1e6


def test_mistyped_constant_features_are_one_line():
    stats = {"kind": "minmax", "min": [0.0, 0.0], "max": [1.0, 1.0], "constant_features": ["x"]}
    with pytest.raises(UserError, match="constant_features must be channel/feature indices below 2"):
        normalization(stats, 2, (-1,), "model.onnx")
