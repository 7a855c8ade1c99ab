"""The `trainforge` command line: parse, call the Python API, render. Nothing else lives here.

    trainforge train                                  # the default recipe (digits, a CNN)
    trainforge train recipes/charlm_gpt.yaml optim.lr=1e-3 train.epochs=2 --run-dir runs/lm
    trainforge train --run-dir runs/lm --resume auto  # continue after a crash or preemption
    trainforge eval runs/lm --split test --json
    trainforge generate runs/lm "def main(" --max-new-tokens 64
    trainforge recipes
    trainforge data prepare recipes/charlm_gpt.yaml   # tokenize the corpus into token shards once, before training
    trainforge runs list                              # the runs under ./runs: status, best metric, duration
    trainforge runs compare runs/a runs/b             # compare.html: curves overlaid, config differences, test metrics

Exit codes: 0 success, 1 the job failed (e.g. diverged), 2 bad input (one line naming the field or
file and the fix).
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from trainforge.compression.commands import register as register_compress
from trainforge.compression.compress_cmd import OBSERVER
from trainforge.config import builtin_recipes, load_config
from trainforge.console import err, out, print_json
from trainforge.launch.torchrun import launch as launch_run, report_user_error
from trainforge.launch.manifests import launch_text
from trainforge.errors import JobFailed, UserError, printable
from trainforge.files import write_text_atomic
from trainforge.hardware.catalog import catalog_rows, load_catalog
from trainforge.jobs.commands import register as register_jobs
from trainforge.planning.render import render_calibration, render_plan
from trainforge.report.commands import register as register_report
from trainforge.tracking import MlflowObserver
from trainforge.tracking.commands import register as register_runs
from trainforge.tuning.commands import register as register_tune
from trainforge.layout import DATA_REPORT, EVAL
from trainforge.training.sampling import MAX_NEW_TOKENS, SEED, TEMPERATURE, TOP_P, check_settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan, train, evaluate and compress PyTorch models from YAML recipes.",
)


SAMPLING_DEFAULTS = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": TEMPERATURE, "top_p": TOP_P, "seed": SEED}


def existing_run(path: Path) -> Path:
    """`path` (a run directory, its final/ or a checkpoint) when it exists, else the line loading it would give:
    said before torch and the model libraries load."""
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    return path


def _split_recipe(recipe: Optional[str], overrides: Optional[List[str]]) -> tuple[Optional[str], list[str]]:
    """`trainforge train optim.lr=1e-3` means the default recipe with an override."""
    overrides = list(overrides or [])
    if recipe is not None and "=" in recipe:
        return None, [recipe, *overrides]
    return recipe, overrides


@app.command()
def train(
    recipe: Optional[str] = typer.Argument(None, help="Recipe YAML path or built-in name; default: digits_cnn."),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. optim.lr=3e-4"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory (default runs/<name>-<time>)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="'auto' or a run/checkpoint directory."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", help="Processes (GPUs) per node: launch through torchrun."),
    nnodes: str = typer.Option("1", "--nnodes", help="Nodes, N or MIN:MAX (elastic)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the rendezvous (multi-node)."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="Restarts of the worker group after a failure."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON document."),
) -> None:
    """Train a model from a recipe (with no recipe: the built-in default, digits with a CNN).

    Length: train.epochs, or train.max_steps=N optimizer steps, which replaces train.epochs (not a cap).

    Batch: train.global_batch_size samples per step; train.micro_batch_size is an upper bound per process.
    """
    recipe, overrides = _split_recipe(recipe, overrides)
    if resume is not None and resume != "auto" and not Path(resume).exists():
        raise UserError(f"--resume: {resume} does not exist; pass 'auto' or a run/checkpoint directory")
    if resume is None or recipe is not None:  # a bad key, a wrong type, a missing recipe: answered before torch loads
        load_config(recipe, overrides)
    from trainforge import train as run_train  # heavy (torch, on use): the CLI starts fast without it

    if nproc_per_node is not None or nnodes != "1" or rdzv_endpoint:
        rd = launch_run(recipe, overrides, run_dir=run_dir, resume=resume, nproc_per_node=1 if nproc_per_node is None else nproc_per_node,
                    nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts)
        done = (rd / EVAL).exists()
        doc = {"run_dir": str(rd), "status": "completed" if done else "interrupted",
               "eval": json.loads((rd / EVAL).read_text()) if done else {}}
        if as_json:
            print_json(doc)
        else:
            out.print(f"run {doc['status']}: {rd}" + ("" if done else f"; resume with --run-dir {rd} --resume auto"))
        return
    try:
        result = run_train(recipe, overrides=overrides, run_dir=run_dir, resume=resume)
    except UserError as e:
        if report_user_error(e):  # a launched worker: its launcher restarts nothing and says it once for all ranks
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)  # no interpreter teardown, as below
        raise
    from trainforge.engine.env import detect  # heavy (torch): the CLI starts fast without it

    if detect()[2] > 1:  # a worker of a launched group: the launcher reports
        # The run is saved and the process group destroyed; skip interpreter teardown, where gloo's worker
        # threads can still hold tensors and abort (SIGABRT) a finished rank, which the launcher would
        # count as a failure of the whole group (pytorch/pytorch#179291).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    doc = {
        "run_dir": str(result.run_dir),
        "status": result.status,
        "steps": result.steps,
        "skipped_steps": result.skipped_steps,
        "micro_batch_size": result.micro_batch_size,
        "data": result.data,
        "val": result.val,
        "eval": {k: v for k, v in result.eval.items() if k not in ("per_class", "confusion_matrix")},
    }
    if as_json:
        print_json(doc)
        return
    table = Table(title=f"run {result.status}", show_header=False)
    table.add_row("run dir", str(result.run_dir))
    table.add_row("steps", str(result.steps))
    if result.data:
        counts = result.data
        table.add_row("data", f"{counts['rows_kept']:,} of {counts['rows_read']:,} rows kept"
                      f"{', ' + str(len(counts['warnings'])) + ' warning(s)' if counts['warnings'] else ''}: "
                      f"{result.run_dir / DATA_REPORT}")
    for k, v in doc["eval"].items():
        if isinstance(v, float):
            table.add_row(f"test {k}", f"{v:.4f}")
    if result.status == "interrupted":
        table.add_row("resume", f"trainforge train --run-dir {result.run_dir} --resume auto")
    out.print(table)


def _cell(value: object) -> str:
    """A per-class table's cell: a score to 3 decimals, a count as it is, nothing for a metric without a value."""
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _shown(value: object) -> str:
    """Text from the data or a path (a class name is a folder name) as table text: no markup, no control characters."""
    return escape(printable(str(value)))


@app.command("eval")
def eval_cmd(
    checkpoint: Path = typer.Argument(..., help="A run directory, its final/, or a checkpoints/step-* directory."),
    split: str = typer.Option("test", "--split", help="train | val | test"),
    device: Optional[str] = typer.Option(None, "--device", help="Override train.device (auto, cpu, cuda:0, ...)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the SHA-256 check of the model files against "
                                   "their manifest.json (e.g. a final/ written before manifests existed)."),
) -> None:
    """Evaluate a checkpoint: its task's metrics (accuracy and macro-F1, perplexity, COCO mAP), per class, and a confusion matrix."""
    existing_run(checkpoint)
    from trainforge.training.evaluate import evaluate_checkpoint  # heavy (torch): the CLI starts fast without it

    result = evaluate_checkpoint(checkpoint, split=split, device=device, verify=not no_verify)
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{split} split of {_shown(result['checkpoint'])} (step {result['step']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.items():  # the task's metrics, as evaluation reported them (None: COCO's "no such objects")
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
            table.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    out.print(table)
    if result.get("per_class"):
        columns = list(next(iter(result["per_class"].values())))  # precision, recall, f1, support; or ap
        from trainforge.tasks import TASKS

        shown = TASKS.get(result["task"]).console_per_class if result.get("task") in TASKS else None
        columns = [c for c in columns if shown is None or c in shown]  # the rest: --json and eval.json
        pc = Table(title="per class")
        for col in ("class", *columns):
            pc.add_column(col, justify="right")
        for name, m in result["per_class"].items():
            pc.add_row(_shown(name), *(_cell(m.get(col)) for col in columns))
        out.print(pc)
    if "confusion_matrix" in result:
        cm = Table(title="confusion matrix (rows: true, columns: predicted)")
        cm.add_column("")
        for name in result["class_names"]:
            cm.add_column(_shown(name), justify="right")
        for name, row in zip(result["class_names"], result["confusion_matrix"]):
            cm.add_row(_shown(name), *[str(v) for v in row])
        out.print(cm)


@app.command()
def generate(
    run_or_checkpoint: Path = typer.Argument(..., help="A causal LM run directory, its final/, or a checkpoints/step-* directory."),
    prompt: str = typer.Argument(..., help="The text to continue (with --chat: the user's message)."),
    chat: bool = typer.Option(False, "--chat", help="Render the prompt as one user message with the tokenizer's chat template."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Most tokens to generate (default 256)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature; 0 = greedy (default 0.7)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling mass in (0, 1] (default 0.9)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed: the same seed, the same text (default 0)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document at the end instead of streaming."),
) -> None:
    """Generate text with a trained causal LM (model.name hf or gpt), streamed to stdout as it comes."""
    given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    check_settings(**{**SAMPLING_DEFAULTS, **{k: v for k, v in given.items() if v is not None}})  # before torch loads
    existing_run(run_or_checkpoint)
    from trainforge.training.generate import generate as run_generate  # heavy (torch, transformers): the CLI starts fast without it

    def stream(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = run_generate(run_or_checkpoint, prompt, chat=chat, on_text=None if as_json else stream,
                          **{k: v for k, v in given.items() if v is not None})  # unset: the API's defaults
    if as_json:
        print_json(result.to_json())
        return
    sys.stderr.write("\n")  # the shell prompt on a line of its own; stdout holds exactly the generated text
    for note in result.notes:
        err.print(f"note: {escape(note)}", highlight=False)
    err.print(f"{result.new_tokens} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s), "
              f"stopped at {result.stopped}", highlight=False)


@app.command()
def launch(
    target: str = typer.Argument(..., help="slurm | k8s | skypilot"),
    recipe: Optional[str] = typer.Argument(None, help="Recipe YAML path or built-in name; default: digits_cnn."),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, embedded in the job file."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes (default 1)."),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", help="Elastic: fewest nodes to run on."),
    max_nodes: Optional[int] = typer.Option(None, "--max-nodes", help="Elastic: most nodes to run on."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs per node (default 8); 0: a CPU-only job (no GPU request)."),
    procs_per_node: Optional[int] = typer.Option(None, "--procs-per-node", help="Training processes per node (default: the GPUs, or 1 without)."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", help="Worker-group restarts (default 3)."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Run directory on the shared filesystem."),
    name: Optional[str] = typer.Option(None, "--name", help="Job name (default: the recipe's name)."),
    image: Optional[str] = typer.Option(None, "--image", help="k8s: container image with trainforge installed."),
    pvc: Optional[str] = typer.Option(None, "--pvc", help="k8s: PersistentVolumeClaim for the run directories."),
    k8s_api: Optional[str] = typer.Option(None, "--k8s-api", metavar="pytorchjob|trainjob", help="k8s: a Kubeflow "
                                          "PyTorchJob (training operator v1, the default) or a Trainer v2 TrainJob."),
    setup: Optional[str] = typer.Option(None, "--setup", help="skypilot: setup commands."),
    accelerator: Optional[str] = typer.Option(None, "--accelerator", help="skypilot: accelerator name (default H100)."),
    spot: bool = typer.Option(False, "--spot", help="skypilot: spot instances (needs --bucket)."),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="skypilot: bucket for checkpoints that survive recovery."),
    partition: Optional[str] = typer.Option(None, "--partition", help="slurm: partition."),
    account: Optional[str] = typer.Option(None, "--account", help="slurm: account to charge."),
    qos: Optional[str] = typer.Option(None, "--qos", help="slurm: quality of service."),
    time_limit: Optional[str] = typer.Option(None, "--time-limit", help="slurm: --time, e.g. 24:00:00."),
    cpus_per_gpu: Optional[int] = typer.Option(None, "--cpus-per-gpu", help="CPUs per GPU, or per process of a CPU-only job (default 8)."),
    mem_per_node_gib: Optional[int] = typer.Option(None, "--mem-per-node-gib", help="Memory per node in GiB."),
    port: Optional[int] = typer.Option(None, "--port", help="Rendezvous port (default 29500)."),
    env: Optional[List[str]] = typer.Option(None, "--env", help="KEY=VALUE for the job's environment (repeatable)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write the job file here instead of stdout."),
) -> None:
    """Write a job file for an existing cluster engine: an sbatch script, a Kubeflow PyTorchJob, a SkyPilot task."""
    recipe, overrides = _split_recipe(recipe, overrides)
    env_vars = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--env: expected KEY=VALUE, got {item!r}")
        env_vars[key] = value
    text = launch_text(
        target, recipe, overrides, nodes=nodes, min_nodes=min_nodes, max_nodes=max_nodes, gpus_per_node=gpus_per_node,
        procs_per_node=procs_per_node, account=account, qos=qos, k8s_api=k8s_api,
        max_restarts=max_restarts, run_dir=run_dir, name=name, image=image, pvc=pvc, setup=setup,
        accelerator=accelerator, spot=spot or None, bucket=bucket, partition=partition, time_limit=time_limit,
        cpus_per_gpu=cpus_per_gpu, mem_per_node_gib=mem_per_node_gib, port=port, env=env_vars or None,
    )
    if out_file is None:
        sys.stdout.write(text)
        return

    if out_file.exists():
        raise UserError(f"--out: {out_file} exists; choose another file or remove it first")
    try:
        write_text_atomic(out_file, text)
    except OSError as e:
        raise UserError(f"--out: cannot write {out_file} ({e.strerror})") from None
    err.print(f"wrote {out_file}")


data_app = typer.Typer(no_args_is_help=True, help="Prepare a recipe's data before training (token shards, WebDataset shards).")
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def data_prepare(
    recipe: str = typer.Argument(..., help="Recipe YAML path or built-in name."),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. data.path=corpus/"),
    data_format: str = typer.Option("tokens", "--format", help="tokens: memory-mapped token shards of an LM corpus; "
                                    "webdataset: tar shards of an image folder, for data.source webdataset."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="webdataset: the directory to write the shards to."),
    shard_samples: Optional[int] = typer.Option(None, "--shard-samples",
                                                help="webdataset: samples per shard (default: about 256 MB each)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Prepare again even when the prepared data is ready."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes (default: one per CPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
) -> None:
    """Prepare the recipe's data once: token shards of a corpus ($TRAINFORGE_HOME/tokens/, which every run then
    reads; runs do it on first use too), or WebDataset tar shards of an image folder (--out) for multi-node runs."""
    cfg = load_config(recipe, overrides or [])  # answered before torch loads
    from trainforge.data.prepare import prepare_data  # heavy (torch): the CLI starts fast without it

    result = prepare_data(cfg.data, seed=cfg.seed, data_format=data_format, rebuild=rebuild, workers=workers,
                          out=out_dir, shard_samples=shard_samples)
    if as_json:
        print_json(result)
        return
    out.print(PREPARED_TABLES[data_format](result))


def _token_table(result: dict) -> Table:
    table = Table(title=f"token shards of {result['corpus']}" + (" (ready, reused)" if result["reused"] else ""),
                  show_header=False)
    table.add_row("directory", result["directory"])
    table.add_row("shards", f"{result['shards']:,} ({result['dtype']})")
    table.add_row("tokens", f"{result['tokens']:,} ({result['tokenizer']})")
    table.add_row("bytes", f"{result['bytes']:,} from {result['corpus_bytes']:,} corpus bytes in "
                  f"{result['corpus_files']:,} file(s)")
    table.add_row("time", f"{result['prepared_s']:.1f} s" + (" (when prepared)" if result["reused"] else ""))
    return table


def _webdataset_table(result: dict) -> Table:
    table = Table(title=f"WebDataset shards in {result['directory']}" + (" (ready, reused)" if result["reused"] else ""),
                  show_header=False)
    for split in ("train", "val", "test"):
        table.add_row(split, f"{result['samples'][split]:,} samples in {result['shards'][split]:,} shard(s)")
    dropped = ", ".join(f"{k} {v:,}" for k, v in result["dropped"].items() if v) or "none"
    table.add_row("read", f"{result['rows_read']:,} files, {result['classes']} classes; dropped: {dropped}")
    table.add_row("bytes", f"{result['bytes']:,} ({result['shard_samples']:,} samples a shard)")
    table.add_row("time", f"{result['prepared_s']:.1f} s" + (" (when prepared)" if result["reused"] else ""))
    table.add_row("train with", f"data.source=webdataset data.path={result['directory']}")
    return table


PREPARED_TABLES = {"tokens": _token_table, "webdataset": _webdataset_table}


@app.command()
def recipes(as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document.")) -> None:
    """List the built-in recipes: the task each trains, what it is, and the command that runs it."""
    rows = []
    for name, path in builtin_recipes().items():
        # The bare name, not the file's first-line comment (`trainforge train recipes/x.yaml`): that path
        # only works from the repository root, and not at all from an installed package.
        task, description = recipe_summary(path)
        rows.append({"name": name, "task": task, "description": description, "path": str(path),
                     "command": f"trainforge train {name}"})
    if as_json:
        print_json(rows)
        return
    table = Table(title="built-in recipes")  # the command names the recipe; it and the task stay whole, to be copied
    table.add_column("run with", no_wrap=True)
    table.add_column("task", no_wrap=True)
    table.add_column("what it trains")
    for r in rows:
        table.add_row(r["command"], r["task"], r["description"])
    out.print(table)


@app.command()
def tasks(as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
          modalities: bool = typer.Option(False, "--modalities",
                                          help="List the data modalities instead (what a sample's input may be)."),
          imports: Optional[List[str]] = typer.Option(None, "--import", metavar="MODULE",
                                                      help="Import this module first (one that registers its own "
                                                           "tasks or modalities); repeatable.")) -> None:
    """List the tasks a recipe can name (`task: NAME`): what each is and the metrics it reports; then the data
    modalities a sample's input may be (with --modalities and --json: those only). A plug-in module's own appear too
    (`--import MODULE`)."""
    from trainforge.data.modalities import MODALITIES
    from trainforge.imports import import_module
    from trainforge.tasks import TASKS

    for module in imports or ():
        import_module(module, "--import")
    rows = [{"name": n, "description": TASKS.get(n).description, "metrics": list(TASKS.get(n).metrics),
             "default_metric": TASKS.get(n).default_metric,
             "direction": TASKS.get(n).direction(TASKS.get(n).default_metric)} for n in TASKS.names()]
    kinds = [{"name": n, "description": MODALITIES.get(n).description,
              "predict_reads": MODALITIES.get(n).served or "arrays (.npz, .npy)"} for n in MODALITIES.names()]
    if as_json:
        print_json(kinds if modalities else rows)
        return
    if not modalities:
        table = Table(title="tasks")
        for column in ("task", "what it is", "metrics (default first)"):
            table.add_column(column)
        for r in rows:
            metrics = [r["default_metric"], *(m for m in r["metrics"] if m != r["default_metric"])]
            table.add_row(r["name"], r["description"], ", ".join(metrics))
        out.print(table)
    table = Table(title="data modalities")
    for column in ("modality", "what a sample's input is", "predict reads"):
        table.add_column(column)
    for r in kinds:
        table.add_row(r["name"], r["description"], r["predict_reads"])
    out.print(table)


def recipe_summary(path: Path) -> tuple[str, str]:
    """(the task the recipe trains, `data.source_tasks.recipe_task`; its one-line description: the second comment
    line, up to its first colon or full stop), from the file alone (no torch)."""
    from trainforge.data.source_tasks import recipe_task

    text = path.read_text(encoding="utf-8")
    doc = yaml.safe_load(text) or {}
    task = recipe_task(doc) if isinstance(doc, dict) else None
    comments = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    line = comments[1] if len(comments) > 1 else ""
    description = re.split(r":\s|\.\s|\.$", line, maxsplit=1)[0].strip()
    return task or "set by data.target", description


def _parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--num-gpus: expected comma-separated counts like 1,2,4,8, got {text!r}") from None
    return counts


@app.command()
def plan(
    recipe: Optional[str] = typer.Argument(None, help="Recipe YAML path or built-in name; default: digits_cnn."),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. train.global_batch_size=512"),
    gpu: Optional[List[str]] = typer.Option(None, "--gpu", help="GPU to consider (repeatable; 'cpu' for this CPU); default: the whole catalog."),
    num_gpus: str = typer.Option("1,2,4,8", "--num-gpus", help="GPU counts to consider, comma-separated."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Most the run may cost."),
    deadline_h: Optional[float] = typer.Option(None, "--deadline-h", help="Most hours the run may take."),
    efficiency: Optional[float] = typer.Option(None, "--efficiency", help="Override the model FLOPs utilization (0-1)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="GPU catalog override file (default: $TRAINFORGE_CATALOG)."),
    calibrate_: bool = typer.Option(False, "--calibrate", help="Run a few real steps here, compare, store the correction."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
) -> None:
    """Predict memory, time and cost on candidate GPUs from a simulated step, and recommend a setup."""
    recipe, overrides = _split_recipe(recipe, overrides)
    cfg = load_config(recipe, overrides)
    cat = load_catalog(catalog)
    if calibrate_:
        from trainforge.training.calibrate import calibrate  # heavy (torch): the CLI starts fast without it

        entry = calibrate(cfg, catalog=cat)
        if as_json:
            print_json(entry)
        else:
            out.print(render_calibration(entry))
        return
    from trainforge.planning.plan import plan as run_plan  # heavy (torch): the CLI starts fast without it

    result = run_plan(cfg, gpus=gpu or None, num_gpus=_parse_counts(num_gpus), budget_usd=budget_usd,
                      deadline_h=deadline_h, efficiency=efficiency, catalog=cat)
    if as_json:
        print_json(result.to_json())
        return
    for renderable in render_plan(result):
        out.print(renderable)


@app.command()
def gpus(
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="YAML file overriding or extending the catalog "
                                           "(default: $TRAINFORGE_CATALOG)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
) -> None:
    """List the GPU catalog: memory, bandwidth, dense peak FLOP/s, cores, power, interconnect, price, sources."""
    rows = catalog_rows(load_catalog(catalog))
    if as_json:
        print_json(rows)
        return
    table = Table(title="GPU catalog (dense tensor peaks; * = figure to verify)")
    for col in ("gpu", "memory GiB", "bandwidth TB/s", "bf16 TF", "fp32 TF", "CUDA cores", "TDP W", "interconnect", "$/h", "price from"):
        table.add_column(col, justify="left" if col in ("gpu", "interconnect", "price from") else "right")
    for r in rows:
        flag = lambda field: "*" if field in r["verify"] else ""  # noqa: E731
        bf16 = r["peak_flops"]["bf16"]
        price = r["price"]
        table.add_row(
            r["name"],
            f"{r['memory_bytes'] / 2**30:.1f}",
            f"{r['memory_bandwidth_bytes_per_s'] / 1e12:.2f}",
            "-" if bf16 is None else f"{bf16 / 1e12:.0f}{flag('peak_flops.bf16')}",
            f"{r['peak_flops']['fp32'] / 1e12:.1f}{flag('peak_flops.fp32')}",
            "-" if r["cuda_cores"] is None else f"{r['cuda_cores']}{flag('cuda_cores')}",
            f"{r['tdp_watts']:.0f}",
            f"{r['interconnect_kind']} {r['interconnect_bytes_per_s'] / 1e9:.0f} GB/s",
            "-" if price is None else f"{price['usd_per_hour']:.2f}",
            "-" if price is None else f"{price['provider']} {price['date']}",
        )
    out.print(table)


def _register_stage_commands() -> None:
    """Each later stage keeps its commands in its own package (`<stage>/commands.py`, light imports only)."""
    for register in (register_tune, register_compress, register_jobs, register_report, register_runs):
        register(app)


_register_stage_commands()


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point: user errors exit 2 with one line, job failures exit 1."""
    try:
        # standalone: typer/click handle usage errors (exit 2) and call sys.exit. The context object carries what this
        # entry point composes for the stages' commands: log.mlflow's observer for compress (as trainforge.compress)
        app(args=argv, obj={OBSERVER: MlflowObserver()})
    except UserError as e:  # printable: a path or a server's answer may hold an ESC; the terminal shows it as \x1b
        err.print(f"[red]error:[/red] {escape(printable(str(e)))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except JobFailed as e:
        err.print(f"[red]failed:[/red] {escape(printable(str(e)))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:  # a second Ctrl-C during training, or one outside it
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
