"""The MLflow model of a trainforge run, logged as code by tracking/mlflow_run.py: MLflow runs this file to load the
model (it is never imported by trainforge itself). Its artifact `final` is the run's final/ directory.

    model = mlflow.pyfunc.load_model("models:/digits/1")          # or runs:/<run id>/model
    logits = model.predict(np.zeros((2, 1, 8, 8), np.float32))   # the signature's input: a batch of samples
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.pyfunc import PythonModel

from trainforge.layout import FINAL
from trainforge.training.artifacts import load_trained


class TrainforgeModel(PythonModel):
    """final/ loaded as `trainforge eval` loads it (manifest verified); predict returns the model's float32 logits."""

    def load_context(self, context: Any) -> None:
        self.model = load_trained(Path(context.artifacts[FINAL])).build_model().eval()

    def predict(self, context, model_input, params=None):  # noqa: ANN001  MLflow reads type hints as a schema
        with torch.no_grad():
            return self.model(torch.as_tensor(np.asarray(model_input))).float().numpy()


mlflow.models.set_model(TrainforgeModel())
