from __future__ import annotations

import gc
from pathlib import Path

import pytest

import trainforge

QUIET = ["log.progress=false", "log.tensorboard=false"]


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> Path:
    """digits_cnn trained briefly (~98% test accuracy); tests copy it before writing into it."""
    run_dir = tmp_path_factory.mktemp("compress") / "digits"
    trainforge.train("digits_cnn", overrides=["train.epochs=8", *QUIET], run_dir=run_dir)
    return run_dir


@pytest.fixture(scope="session")
def text_run(tmp_path_factory) -> Path:
    """textcls_transformer (the recipe's model) on fewer generated samples."""
    run_dir = tmp_path_factory.mktemp("compress") / "text"
    trainforge.train("textcls_transformer", overrides=["data.args.num_samples=1500", "train.epochs=3", *QUIET],
                     run_dir=run_dir)
    return run_dir


@pytest.fixture(autouse=True)
def _free_onnxruntime_sessions():
    """Collect sessions left in reference cycles (an error's traceback holds the frame that held one) now.

    Otherwise a later test's forked DataLoader worker may run the collection and destroy a session whose
    thread-pool lock some parent thread held at fork time: the worker then waits forever.
    """
    yield
    gc.collect()
