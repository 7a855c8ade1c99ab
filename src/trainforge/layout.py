"""What a run directory and a job directory hold, by name: the one place those names are spelled.

    run = RunDir(Path("runs/digits"))
    run.config, run.metrics, run.eval          # runs/digits/config.yaml, metrics.jsonl, eval.json
    run.checkpoints / f"step-{step:06d}"       # a checkpoint; run.latest names the newest complete one
    run.final_meta                             # final/model.json (run.final_weights: final/model.safetensors)
    job = JobDir(Path("runs/server/jobs/7"))   # job.recipe (job.yaml), job.run (run/), job.log, job.exit ...

The run directory (docs/architecture.md, "The run directory"; its names are a contract: tests, the dashboard, tune,
the planner's calibration and other tools read them):

    config.yaml  metrics.jsonl  data_report.json  eval.json  report.html  tensorboard/  mlflow.json
    checkpoints/step-000120/ ... checkpoints/latest    final/model.safetensors final/model.json [final/hf/ ...]
    compressed/   (trainforge compress)

A job directory of the job server holds job.yaml (the frozen recipe), run/ (its run directory), log.txt,
exit.json (how the last attempt ended), sandbox.json (its fence) and tmp/ (its private temp folder).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"  # the resolved config the run ran
METRICS = "metrics.jsonl"  # one JSON object per train / val row
DATA_REPORT = "data_report.json"  # rows read, dropped and why, splits, normalization statistics
EVAL = "eval.json"  # test metrics of the final (or best) model
REPORT = "report.html"  # plots and tables of the run
TENSORBOARD = "tensorboard"
MLFLOW_STATE = "mlflow.json"  # what the run uploaded to MLflow, and where
CHECKPOINTS = "checkpoints"
LATEST = "latest"  # in checkpoints/: the name of the newest complete checkpoint, written last
STEP_PREFIX = "step-"  # checkpoints/step-000120
STEP_GLOB = STEP_PREFIX + "*"  # every checkpoint directory of checkpoints/ (renamed into place or not)
TMP_STEP_GLOB = ".tmp-" + STEP_GLOB  # a checkpoint still being written (or left by a kill mid-write)
FINAL = "final"
WEIGHTS = "model.safetensors"  # in final/ and in every checkpoint
META = "model.json"  # in final/: config, data facts, preprocessing, digests
COMPRESSED = "compressed"  # `trainforge compress`'s default output folder
CONFIG_TEXT = "config_yaml"  # the key under which a checkpoint, final/model.json and a job carry the config's YAML
USER_ERROR = ".user_error"  # a launched worker's one-line error, for every node's launcher
OOM_RESTART = "oom_restart.json"  # the micro-batch that ran out of memory, for the group's restart
VAL_IMAGES = "val_images.png"  # the first validation images with predictions and truth drawn, at the last evaluation
SAMPLES = "samples.jsonl"  # a chat run's answers to fixed validation prompts, a line each
MANIFEST = "manifest.json"  # in final/, a checkpoint, compressed/: the SHA-256 of every file beside it
STATE = "state.pt"  # in a checkpoint: step, optimizer, RNG states (weights are in model.safetensors)
ADAPTER = "adapter"  # in final/: a LoRA run's adapters, loadable by PEFT
COMPRESS_RECORD = "compress.json"  # in compressed/: the variants, their sizes, latencies and accuracy

JOB_RECIPE = "job.yaml"
JOB_RUN = "run"
JOB_LOG = "log.txt"
JOB_EXIT = "exit.json"
JOB_SANDBOX = "sandbox.json"
JOB_TMP = "tmp"
JOB_CONFIG = "job-config.yaml"  # the recipe a cluster job's batch script writes for the trainer (the job server: in
# the job's folder; `launch slurm` on its own: in the run directory)


def step_dir_name(step: int) -> str:
    """The checkpoint directory of an optimizer step: 120 -> "step-000120"."""
    return f"{STEP_PREFIX}{step:06d}"


def step_of(name: str) -> int:
    """The step a checkpoint directory name stands for: "step-000120" -> 120 (ValueError for any other name)."""
    if not name.startswith(STEP_PREFIX):
        raise ValueError(f"{name!r} is not a checkpoint name ({STEP_PREFIX}NNNNNN)")
    return int(name.removeprefix(STEP_PREFIX))


@dataclass(frozen=True)
class RunDir:
    """A run directory's files by name (nothing is created or read here)."""

    path: Path

    def __truediv__(self, name: str) -> Path:
        return Path(self.path) / name

    @property
    def config(self) -> Path:
        return self / CONFIG

    @property
    def metrics(self) -> Path:
        return self / METRICS

    @property
    def data_report(self) -> Path:
        return self / DATA_REPORT

    @property
    def eval(self) -> Path:
        return self / EVAL

    @property
    def report(self) -> Path:
        return self / REPORT

    @property
    def tensorboard(self) -> Path:
        return self / TENSORBOARD

    @property
    def mlflow_state(self) -> Path:
        return self / MLFLOW_STATE

    @property
    def checkpoints(self) -> Path:
        return self / CHECKPOINTS

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST

    @property
    def final(self) -> Path:
        return self / FINAL

    @property
    def final_weights(self) -> Path:
        return self.final / WEIGHTS

    @property
    def final_meta(self) -> Path:
        return self.final / META

    @property
    def compressed(self) -> Path:
        return self / COMPRESSED


@dataclass(frozen=True)
class JobDir:
    """A job directory of the job server by name."""

    path: Path

    @property
    def recipe(self) -> Path:
        return Path(self.path) / JOB_RECIPE

    @property
    def run(self) -> Path:
        return Path(self.path) / JOB_RUN

    @property
    def log(self) -> Path:
        return Path(self.path) / JOB_LOG

    @property
    def exit(self) -> Path:
        return Path(self.path) / JOB_EXIT

    @property
    def sandbox(self) -> Path:
        return Path(self.path) / JOB_SANDBOX

    @property
    def tmp(self) -> Path:
        return Path(self.path) / JOB_TMP
