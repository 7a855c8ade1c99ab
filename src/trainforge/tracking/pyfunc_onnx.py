"""The MLflow model of a run's compressed ONNX variant, logged as code by tracking/mlflow_run.py (never imported by
trainforge itself): served with onnxruntime as `trainforge predict` serves it, no torch. Its artifact `compressed`
holds the recommended variant with compress.json and the manifest that vouches for both.

    model = mlflow.pyfunc.load_model("models:/digits/2")
    logits = model.predict(np.zeros((2, 1, 8, 8), np.float32))
"""
from __future__ import annotations

from typing import Any

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel

from trainforge.compression.predict import load_artifact, run_batch


class TrainforgeOnnxModel(PythonModel):
    def load_context(self, context: Any) -> None:
        self.artifact = load_artifact(context.artifacts["compressed"])  # the recommended variant, verified

    def predict(self, context, model_input, params=None):  # noqa: ANN001  MLflow reads type hints as a schema
        # one array, or a dict of them by input name for a model of several inputs; the output the task serves
        batch = model_input if isinstance(model_input, dict) else np.asarray(model_input)
        return run_batch(self.artifact, batch)


mlflow.models.set_model(TrainforgeOnnxModel())
