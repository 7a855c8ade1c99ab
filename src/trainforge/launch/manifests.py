"""Job files for existing cluster engines: a Slurm sbatch script, a Kubeflow PyTorchJob, a SkyPilot task.

    text = launch_text("slurm", "recipes/gpt2_small_synthetic.yaml", ["train.max_steps=5000"], nodes=4)
    text = render("k8s", JobSpec(name="gpt2", recipe_text=cfg.to_yaml(), nodes=2))

Every job file embeds the resolved recipe, so it runs without the recipe file, and starts
`trainforge train ... --run-dir DIR --resume auto` on every node through torchrun's elastic c10d
rendezvous. DIR lies on storage that outlives a node (Slurm: the shared filesystem the job is
submitted from; Kubernetes: a PersistentVolumeClaim; SkyPilot: a cloud bucket), so a job that the
engine restarts after a failure or a preemption continues from its newest checkpoint.

Pretrained models and weights the recipe names (`model.args.pretrained`, `data.from_model`, ...) are read by
every node itself: the job file says at its top which, and from where (a hub id: the node's cache, else the
hub; a path: that path on the node), and a local path is also a warning when the file is written, since the
cluster's nodes rarely have the folder that the machine writing the job file has.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, NoReturn, Optional

import yaml

from trainforge.config import Config, load_config
from trainforge.errors import UserError
from trainforge.registry import Registry
from trainforge.layout import CONFIG, JOB_CONFIG
from trainforge.weights import from_model_sources, sources

LAUNCHERS: Registry[Callable[["JobSpec"], str]] = Registry("launcher", "launch target")

# Only a line equal to this ends the embedded recipe; the quotes around it in `<<'...'` stop the
# shell from expanding $VAR, `cmd` and backslashes inside the recipe.
CONFIG_EOF = "TRAINFORGE_CONFIG_EOF"
K8S_CONFIG_DIR = "/etc/trainforge"
K8S_RUNS_MOUNT = "/runs"
SKYPILOT_RUNS_MOUNT = "/runs"
K8S_APIS = ("pytorchjob", "trainjob")  # `launch k8s --k8s-api`: the v1 PyTorchJob (older clusters) or a v2 TrainJob
TRAINJOB_NODE = "node"  # the replicated job and container of Kubeflow Trainer's torch runtimes
TERM_GRACE_S = 120  # SIGTERM this long before the kill: time for every rank to write a checkpoint

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SLURM_WORD = re.compile(r"[A-Za-z0-9._,:-]+\Z")  # safe inside an #SBATCH line, which sbatch parses itself


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model or weight set the job loads on every node: the config fields that name it, the value,
    and where a node finds it: `path` (that path on the node), else `hf` (a hub id: the Hugging Face cache, else
    the hub), `timm` (timm's own weights of an architecture: the same) or `torchvision` (a weight set: torch's
    hub cache, else a download)."""

    fields: tuple[str, ...]
    value: str
    kind: Literal["path", "hf", "timm", "torchvision"]


def pretrained_sources(cfg: Config) -> list[Pretrained]:
    """What `cfg` loads from outside the job file, one entry per distinct source, in config order: what its model
    family and data.from_model declare (trainforge/weights.py)."""
    found: list[Pretrained] = []
    kinds = {"hf": "hf", "timm": "timm", "torchvision": "torchvision", "file": "path"}  # name, inline: nothing read
    for source in (*sources(cfg.model.name, cfg.model.args), *from_model_sources(cfg.data.from_model)):
        kind = kinds.get(source.kind)
        if kind is None or not isinstance(source.value, str) or not source.value:
            continue
        kind = "path" if kind == "hf" and _looks_local(source.value) else kind
        same = next((p for p in found if p.value == source.value), None)
        if same is None:
            found.append(Pretrained((source.field,), source.value, kind))
        else:
            found[found.index(same)] = dataclasses.replace(same, fields=(*same.fields, source.field))
    return found


def _looks_local(value: str) -> bool:
    # as the loaders read it: a folder that exists is read as one, and so is anything shaped like a path
    return (value.startswith(("/", "~", ".")) or "\\" in value or value.count("/") > 1
            or Path(value).expanduser().exists())


# Where each target's nodes can read a local path, and how they keep a downloaded model between starts.
LOCAL_PATH_HINT = {
    "slurm": "on the shared filesystem; a relative path is read from the directory you sbatch from",
    "k8s": f"in the image, or on the PVC, which is mounted at {K8S_RUNS_MOUNT}",
    "skypilot": f"in the bucket that --bucket mounts at {SKYPILOT_RUNS_MOUNT}, or in a file_mounts entry you add",
}
CACHE_HINT = {
    "slurm": "the job inherits the environment of the shell you sbatch from, HF_HOME and TORCH_HOME included",
    "k8s": f"a pod's own cache is lost with it: --env HF_HOME={K8S_RUNS_MOUNT}/.cache/huggingface (or TORCH_HOME) "
           "keeps it on the PVC",
    "skypilot": "--env HF_HOME=... (or TORCH_HOME) names a cache the nodes share",
}
_CACHES = {"hf": ("the Hugging Face cache", "HF_HOME"), "timm": ("the Hugging Face cache", "HF_HOME"),
           "torchvision": ("torch's hub cache", "TORCH_HOME")}


def pretrained_notes(target: str, sources: tuple[Pretrained, ...]) -> list[str]:
    """Comment lines for the top of the job file: what each node loads and from where. Values are quoted with
    repr(), which escapes line breaks: a value can never end its comment and become a line of the script."""
    if not sources:
        return []
    lines = ["Pretrained models this job loads (every node reads them itself):"]
    for p in sources:
        fields = ", ".join(p.fields)
        if p.kind == "path":
            lines.append(f"  {p.value!r} ({fields}): a path; it must exist there on every node, "
                         f"{LOCAL_PATH_HINT.get(target, 'on storage every node mounts')}")
            continue
        cache, env = _CACHES[p.kind]
        what = {"hf": "a Hugging Face hub id", "timm": "timm's own weights of this architecture",
                "torchvision": "a torchvision weight set"}[p.kind]
        lines.append(f"  {p.value!r} ({fields}): {what}, read from {cache} of the node (${env}), else downloaded")
    if any(p.kind != "path" for p in sources):
        lines += ["  Nodes without network need it in their cache first (`hf download ID` for a hub id) and",
                  "  --env HF_HUB_OFFLINE=1; " + CACHE_HINT.get(target, "--env HF_HOME=... names the cache") + "."]
    return lines


def _warn_local_paths(target: str, sources: tuple[Pretrained, ...]) -> None:
    for p in sources:
        if p.kind == "path":
            warnings.warn(f"{' and '.join(p.fields)}: {p.value!r} is a local path; the job's nodes read it at that "
                          f"path, so it must exist there on each of them "
                          f"({LOCAL_PATH_HINT.get(target, 'on storage every node mounts')}), or name a hub id",
                          stacklevel=3)


def _with_comments(text: str, comments: list[str]) -> str:
    """`comments` as `#` lines at the top of a job file (after a `#!` line, which must stay first)."""
    if not comments:
        return text
    block = "".join(f"# {line}\n" for line in comments)
    if text.startswith("#!"):
        first, _, rest = text.partition("\n")
        return f"{first}\n{block}{rest}"
    return block + text


# JobSpec fields filled from the recipe or by the job server, not given as options
INTERNAL_FIELDS = ("recipe_text", "pretrained", "command", "config_file")


@dataclass(frozen=True)
class JobSpec:
    """What a cluster job needs besides the recipe. Invalid values raise UserError naming the option."""

    name: str  # job name; launch_text uses the recipe's `name`
    recipe_text: str  # the resolved recipe, embedded verbatim in the job file
    nodes: int = 1
    min_nodes: Optional[int] = None  # elastic range (torchrun --nnodes MIN:MAX); default: nodes
    max_nodes: Optional[int] = None
    gpus_per_node: int = 8  # 0: a CPU-only job (no GPU request in the file; CPU processes, train.device=cpu)
    procs_per_node: Optional[int] = None  # training processes per node; default: gpus_per_node, or 1 without GPUs
    max_restarts: int = 3  # torchrun restarts of the worker group before the job fails
    run_dir: Optional[str] = None  # None: runs/NAME on the target's shared storage (see run_dir_for)
    image: str = "trainforge:latest"  # k8s: a container image with trainforge installed
    pvc: str = "trainforge-runs"  # k8s: ReadWriteMany PersistentVolumeClaim mounted at /runs
    k8s_api: str = "pytorchjob"  # k8s: pytorchjob (Kubeflow training operator, kubeflow.org/v1) or trainjob (Trainer v2)
    k8s_runtime: str = "torch-distributed"  # k8s trainjob: the ClusterTrainingRuntime it runs on
    setup: str = "pip install trainforge"  # skypilot: commands that install trainforge on each node
    accelerator: str = "H100"  # skypilot accelerator name (`sky show-gpus`)
    spot: bool = False  # skypilot: spot instances; run it with `sky jobs launch` to recover
    bucket: Optional[str] = None  # skypilot: bucket URL (s3://, gs://, ...) mounted at /runs
    partition: Optional[str] = None  # slurm
    account: Optional[str] = None  # slurm --account
    qos: Optional[str] = None  # slurm --qos
    time_limit: Optional[str] = None  # slurm --time, e.g. "24:00:00"
    cpus_per_gpu: int = 8  # CPUs per training process (per GPU, or per CPU process when gpus_per_node is 0)
    mem_per_node_gib: Optional[int] = None
    port: int = 29500  # c10d rendezvous port on the head node
    env: dict[str, str] = field(default_factory=dict)  # extra environment, e.g. {"NCCL_DEBUG": "INFO"}
    pretrained: tuple[Pretrained, ...] = ()  # what the nodes load besides the recipe (launch_text fills it)
    command: tuple[str, ...] = ("trainforge",)  # the words that start trainforge on a node (the job server names its python)
    # slurm: where the batch script writes the recipe; None: $run_dir/<layout.JOB_CONFIG>. The job server names a file in
    # the job's folder, which the fenced trainer cannot write: a link it left in its run directory is never followed
    config_file: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.name.strip():
            _bad("name", "must not be empty")
        if "\0" in self.recipe_text:
            raise UserError("recipe: contains a NUL byte, which no job file can carry; remove it")
        for option in ("nodes", "cpus_per_gpu"):
            if getattr(self, option) < 1:
                _bad(option, f"must be at least 1, got {getattr(self, option)}")
        if self.gpus_per_node < 0:
            _bad("gpus_per_node", f"must be 0 (a CPU-only job) or more, got {self.gpus_per_node}")
        if self.procs_per_node is not None and self.procs_per_node < 1:
            _bad("procs_per_node", f"must be at least 1, got {self.procs_per_node}")
        if not self.command:
            _bad("command", "must name the program that runs trainforge")
        if self.max_restarts < 0:
            _bad("max_restarts", f"must be >= 0, got {self.max_restarts}")
        if not 1 <= self.port <= 65535:
            _bad("port", f"must be a TCP port (1-65535), got {self.port}")
        if self.mem_per_node_gib is not None and self.mem_per_node_gib < 1:
            _bad("mem_per_node_gib", f"must be at least 1, got {self.mem_per_node_gib}")
        if self.min_nodes is not None and self.min_nodes < 1:
            _bad("min_nodes", f"must be at least 1, got {self.min_nodes}")
        low, high = self.node_range
        if low > high:
            _bad("min_nodes", f"({low}) must be <= --max-nodes ({high})")
        if not low <= self.nodes <= high:
            _bad("nodes", f"({self.nodes}) must lie between --min-nodes ({low}) and --max-nodes ({high})")
        if self.k8s_api not in K8S_APIS:
            _bad("k8s_api", f"expected {' or '.join(K8S_APIS)}, got {self.k8s_api!r}")
        for key in self.env:
            if not _ENV_NAME.match(key):
                _bad("env", f"{key!r} is not a valid variable name; use letters, digits and _")

    @property
    def node_range(self) -> tuple[int, int]:
        low = self.nodes if self.min_nodes is None else self.min_nodes
        high = self.nodes if self.max_nodes is None else self.max_nodes
        return low, high

    @property
    def elastic(self) -> bool:
        low, high = self.node_range
        return low != high

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes: N, or MIN:MAX for an elastic job."""
        low, high = self.node_range
        return f"{low}:{high}" if low != high else str(low)

    @property
    def cpu_only(self) -> bool:
        return self.gpus_per_node == 0

    @property
    def nproc(self) -> int:
        """Training processes per node (torchrun's --nproc-per-node)."""
        if self.procs_per_node is not None:
            return self.procs_per_node
        return self.gpus_per_node or 1

    @property
    def cpus_per_node(self) -> int:
        return self.nproc * self.cpus_per_gpu

    @property
    def slug(self) -> str:
        """The name with anything but letters, digits, '.', '_' and '-' replaced: safe in paths and #SBATCH."""
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.name.strip()).strip("-.") or "job"


def _bad(option: str, problem: str) -> NoReturn:
    raise UserError(f"--{option.replace('_', '-')}: {problem}")


def run_dir_for(spec: JobSpec, shared_root: str = "runs") -> str:
    """The run directory on the target: spec.run_dir ('{name}' filled in) or SHARED_ROOT/NAME."""
    template = spec.run_dir if spec.run_dir is not None else f"{shared_root}/{{name}}"
    try:
        return template.format(name=spec.slug)
    except (KeyError, IndexError, ValueError):
        raise UserError(f"--run-dir: {template!r} may contain only the placeholder {{name}}") from None


def render(target: str, spec: JobSpec) -> str:
    """The job file for `target` (one of LAUNCHERS.names()) as text, ready to write and submit; a warning for
    each local path among `spec.pretrained`."""
    text = LAUNCHERS.get(target)(spec)
    _warn_local_paths(target, spec.pretrained)
    return _with_comments(text, pretrained_notes(target, spec.pretrained))


def launch_text(target: str, recipe: Optional[str], overrides: list[str], **options: Any) -> str:
    """`trainforge launch TARGET RECIPE [KEY=VALUE ...] [--nodes N] ...`: load, resolve and render.

    `options` are JobSpec fields (nodes=4, gpus_per_node=8, ...); `name` defaults to the recipe's.
    """
    LAUNCHERS.get(target)  # an unknown target fails before the recipe is read
    fields = {f.name for f in dataclasses.fields(JobSpec) if f.name not in INTERNAL_FIELDS}
    unknown = sorted(set(options) - fields)
    if unknown:
        _bad(unknown[0], f"unknown option; valid: {', '.join('--' + f.replace('_', '-') for f in sorted(fields))}")
    cfg = load_config(recipe, overrides)
    options = {k: v for k, v in options.items() if v is not None}  # None: the option was not given
    options.setdefault("name", cfg.name)
    return render(target, JobSpec(recipe_text=cfg.to_yaml(), pretrained=tuple(pretrained_sources(cfg)), **options))


def _config_text(spec: JobSpec) -> str:
    """The recipe as it will land on disk, ending in a newline (a heredoc always writes one)."""
    text = spec.recipe_text if spec.recipe_text.endswith("\n") else spec.recipe_text + "\n"
    if CONFIG_EOF in text.split("\n"):
        raise UserError(f"recipe: a line equal to {CONFIG_EOF} would end the embedded recipe early; change it")
    return text


def _write_config_lines(path_expr: str, spec: JobSpec) -> list[str]:
    """Shell lines that write the embedded recipe byte for byte to PATH_EXPR (already quoted)."""
    # split on \n only: str.splitlines would also split on \r, \x0c, \u2028 ... and lose them
    return [f"cat > {path_expr} <<'{CONFIG_EOF}'", *_config_text(spec)[:-1].split("\n"), CONFIG_EOF]


def _train_args(config_path: str, run_dir: str, nproc: str, nnodes: str, endpoint: str, spec: JobSpec) -> list[str]:
    """`trainforge train` as the node runs it: a CPU-only job adds train.device=cpu (it must not take a GPU that
    the node happens to have, and that the engine did not give it)."""
    return [
        *(shlex.quote(word) for word in spec.command), "train", config_path,
        *(["train.device=cpu"] if spec.cpu_only else []),
        "--run-dir", run_dir,
        "--resume", "auto",
        "--nproc-per-node", nproc,
        "--nnodes", nnodes,
        "--rdzv-endpoint", endpoint,
        "--max-restarts", str(spec.max_restarts),
    ]  # fmt: skip


def _shell_command(words: list[str], head_words: int = 3) -> str:
    """Pre-quoted words joined with line continuations: the head (up to and including the recipe, and a CPU job's
    device override), then a flag and its value a line."""
    first_flag = next((i for i, w in enumerate(words) if w == "--run-dir"), None)
    if first_flag is not None:
        head_words = first_flag
    head, rest = words[:head_words], words[head_words:]
    lines = [" ".join(head)] + ["  " + " ".join(rest[i : i + 2]) for i in range(0, len(rest), 2)]
    return " \\\n".join(lines)


def _head_node_lines() -> list[str]:
    """Shell lines that find the address of the allocation's first node, which hosts the rendezvous."""
    return [
        "",
        '# the first node of the allocation hosts the rendezvous (sed, not head: no SIGPIPE under pipefail)',
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "# ... at the address Slurm reaches it by (NodeAddr: the node's name itself on most clusters)",
        """head_addr=$(scontrol show node "$head_node" 2>/dev/null | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | sed -n 1p)""",
        'head_addr=${head_addr:-$head_node}',
    ]


def _cpu_env_lines(spec: JobSpec) -> list[str]:
    """A CPU-only job's environment: no GPU visible, and each process's threads matched to its CPUs."""
    if not spec.cpu_only:
        return []
    return ["export CUDA_VISIBLE_DEVICES=", f"export OMP_NUM_THREADS={spec.cpus_per_gpu}"]


# ------------------------------------------------------------------ slurm


@LAUNCHERS.register("slurm")
def render_slurm(spec: JobSpec) -> str:
    """An sbatch script: one srun task per node runs `trainforge train` (torchrun) with the GPUs of its node.

    Preemption and time limits: `--requeue` lets Slurm requeue a preempted job, and
    `--signal=B:TERM@120` sends SIGTERM to the batch shell two minutes before the kill; the shell
    passes it to srun (which signals every task: each rank writes a checkpoint) and requeues the job,
    whose next start resumes from that checkpoint.
    """
    for option in ("partition", "account", "qos", "time_limit"):
        value = getattr(spec, option)
        if value is not None and not _SLURM_WORD.match(value):
            _bad(option, f"{value!r} has characters sbatch would misread; use letters, digits and . _ , : -")
    cpus_per_task = spec.cpus_per_node
    directives = [
        f"--job-name={spec.slug}",
        # an elastic job starts on --nodes (Slurm would give a MIN-MAX range its minimum) and, with --no-kill, keeps
        # its allocation when a node fails: torchrun (--nnodes MIN:MAX) goes on with the nodes that are left
        f"--nodes={spec.nodes}",
        *(["--no-kill"] if spec.elastic else []),
        "--ntasks-per-node=1",  # one torchrun agent per node; it starts one process per GPU (or CPU process)
        *([f"--gpus-per-node={spec.gpus_per_node}"] if not spec.cpu_only else []),  # no GRES on a CPU partition
        f"--cpus-per-task={cpus_per_task}",
        *([f"--partition={spec.partition}"] if spec.partition else []),
        *([f"--account={spec.account}"] if spec.account else []),
        *([f"--qos={spec.qos}"] if spec.qos else []),
        *([f"--time={spec.time_limit}"] if spec.time_limit else []),
        *([f"--mem={spec.mem_per_node_gib}G"] if spec.mem_per_node_gib else []),
        "--requeue",
        f"--signal=B:TERM@{TERM_GRACE_S}",
        "--open-mode=append",  # a requeued job appends to its log instead of truncating it
    ]
    train = _train_args('"$config_file"', '"$run_dir"', str(spec.nproc), shlex.quote(spec.nnodes),
                        f'"$head_addr:{spec.port}"', spec)  # fmt: skip
    multi_node = spec.nodes > 1 or spec.elastic
    if not multi_node:  # one node: torchrun's standalone rendezvous on a free port (two jobs may share a node)
        for flag in ("--nnodes", "--rdzv-endpoint"):
            at = train.index(flag)
            del train[at:at + 2]
    # newer Slurm does not pass sbatch's --cpus-per-task on to srun
    srun = ["srun", *(["--no-kill"] if spec.elastic else []), "--ntasks-per-node=1", f"--cpus-per-task={cpus_per_task}",
            *train]
    lines = [
        "#!/bin/bash",
        f"# trainforge job {spec.slug!r}: submit with `sbatch FILE` from a directory on the shared filesystem.",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        "",
        f"run_dir={shlex.quote(run_dir_for(spec))}",
        f"config_file={shlex.quote(spec.config_file)}" if spec.config_file else f'config_file="$run_dir/{JOB_CONFIG}"',
        'mkdir -p "$run_dir"',
        *_write_config_lines('"$config_file"', spec),
        *_cpu_env_lines(spec),
        *(f"export {key}={shlex.quote(value)}" for key, value in spec.env.items()),
        *(_head_node_lines() if multi_node else []),
        "",
        "# SIGTERM before the time limit (or a preemption): let every rank checkpoint, then requeue;",
        "# the next start continues from the checkpoint (--resume auto).",
        "# A job cancelled with scancel gets the same SIGTERM: it checkpoints too, and is not requeued.",
        "on_term() {",
        '  kill -TERM "$srun_pid" 2>/dev/null || true',
        """  state=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.*JobState=\\([A-Z_]*\\).*/\\1/p' | sed -n 1p)""",
        '  if [ "$state" = CANCELLED ]; then',
        '    echo "trainforge: job $SLURM_JOB_ID cancelled; checkpointing" >&2',
        '    wait "$srun_pid" || true',
        "    exit 0",
        "  fi",
        '  echo "trainforge: SIGTERM; checkpointing, then requeueing job $SLURM_JOB_ID" >&2',
        '  wait "$srun_pid" || true',
        '  scontrol requeue "$SLURM_JOB_ID" || true',
        "  exit 0",
        "}",
        "trap on_term TERM",
        "",
        "# in the background, so that the trap runs as soon as the signal arrives",
        _shell_command(srun) + " &",
        "srun_pid=$!",
        'wait "$srun_pid"',
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ YAML targets


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # write Master and Worker pods out in full, no &id001
        return True


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # literal blocks keep embedded scripts and recipes readable; PyYAML falls back to a quoted
    # scalar by itself when a block cannot hold the text exactly
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _represent_str)


def _dump_yaml(*documents: dict[str, Any]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=10_000, default_flow_style=False)


def k8s_name(name: str) -> str:
    """A DNS-1035 label for the job (lowercase, digits, '-'), short enough for `<name>-worker-<i>`."""
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not slug[:1].isalpha():
        slug = "tf-" + slug
    return slug[:45].rstrip("-")


# ------------------------------------------------------------------ kubernetes


@LAUNCHERS.register("k8s")
def render_k8s(spec: JobSpec) -> str:
    """A ConfigMap holding the recipe, then the job: a Kubeflow PyTorchJob (training operator, kubeflow.org/v1; the
    default) or, with `k8s_api="trainjob"`, a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) on the
    `torch-distributed` runtime. Every node mounts the recipe, the run directory's PVC and a memory-backed /dev/shm.

    PyTorchJob: Master is node 0 and hosts the c10d rendezvous at $(MASTER_ADDR):$(MASTER_PORT), which the operator
    sets; Workers are the other nodes; `restartPolicy: OnFailure` restarts a failed pod, and the run directory on the
    PVC lets the restarted job resume. TrainJob: the runtime starts numNodes pods and sets $(PET_MASTER_ADDR) and
    $(PET_MASTER_PORT); the mounts go in as a runtime patch of its `node` container.
    """
    name = k8s_name(spec.name)
    config_map = f"{name}-config"
    run_dir = run_dir_for(spec, K8S_RUNS_MOUNT)
    resources: dict[str, Any] = {
        "limits": {"nvidia.com/gpu": str(spec.gpus_per_node)} if not spec.cpu_only else {},
        "requests": {"cpu": str(spec.cpus_per_node)},  # quantities are strings in the API
    }
    if spec.mem_per_node_gib:
        resources["limits"]["memory"] = resources["requests"]["memory"] = f"{spec.mem_per_node_gib}Gi"
    if not resources["limits"]:
        del resources["limits"]
    env = {**({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(spec.cpus_per_gpu)} if spec.cpu_only else {}),
           **spec.env}
    env_list = [{"name": key, "value": value} for key, value in env.items()]
    mounts = [
        {"name": "config", "mountPath": K8S_CONFIG_DIR, "readOnly": True},
        {"name": "runs", "mountPath": K8S_RUNS_MOUNT},
        {"name": "dshm", "mountPath": "/dev/shm"},  # DataLoader workers pass batches through shared memory
    ]
    volumes = [
        {"name": "config", "configMap": {"name": config_map}},
        {"name": "runs", "persistentVolumeClaim": {"claimName": spec.pvc}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    config_doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config_map},
                  "data": {CONFIG: _config_text(spec)}}
    if spec.k8s_api == "trainjob":
        return _dump_yaml(config_doc, _trainjob(spec, name, run_dir, resources, env_list, mounts, volumes))
    command = _train_args(f"{K8S_CONFIG_DIR}/{CONFIG}", run_dir, str(spec.nproc), spec.nnodes,
                          "$(MASTER_ADDR):$(MASTER_PORT)", spec)  # fmt: skip
    container = {
        "name": "pytorch",  # the training operator looks the container up by this name
        "image": spec.image,
        "command": command,
        "env": env_list,
        # the operator reads MASTER_PORT (and the elastic rendezvous port) from this named port
        "ports": [{"name": "pytorchjob-port", "containerPort": spec.port}],
        "resources": resources,
        "volumeMounts": mounts,
    }
    if not container["env"]:
        del container["env"]
    pod = {
        "terminationGracePeriodSeconds": TERM_GRACE_S,  # time to checkpoint between SIGTERM and SIGKILL
        "containers": [container],
        "volumes": volumes,
    }

    def replicas(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": pod}}

    low, high = spec.node_range
    replica_specs = {"Master": replicas(1)}
    if high > 1:  # an elastic job keeps its Worker set (possibly empty) so it can be scaled up
        replica_specs["Worker"] = replicas(spec.nodes - 1)
    job_spec: dict[str, Any] = {}
    if spec.elastic:
        job_spec["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "rdzvHost": f"{name}-master-0",
            "rdzvPort": spec.port,
            "minReplicas": low,
            "maxReplicas": high,
            "maxRestarts": spec.max_restarts,
        }
    job_spec["pytorchReplicaSpecs"] = replica_specs
    # the operator's default, said outright: the SDK's model of the spec (and older operators) require a runPolicy
    job_spec["runPolicy"] = {"cleanPodPolicy": "Running"}
    return _dump_yaml(config_doc, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
                                   "spec": job_spec})


def _trainjob(spec: JobSpec, name: str, run_dir: str, resources: dict[str, Any], env: list[dict[str, str]],
              mounts: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A Kubeflow Trainer v2 TrainJob: numNodes pods of the runtime, our command in its `node` container."""
    if spec.elastic:
        _bad("min_nodes", "a TrainJob runs a fixed numNodes; drop --min-nodes/--max-nodes, or use --k8s-api pytorchjob")
    command = _train_args(f"{K8S_CONFIG_DIR}/{CONFIG}", run_dir, str(spec.nproc), str(spec.nodes),
                          "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)", spec)  # fmt: skip
    trainer: dict[str, Any] = {"image": spec.image, "command": command, "numNodes": spec.nodes,
                               "numProcPerNode": spec.nproc, "resourcesPerNode": resources}
    if env:
        trainer["env"] = env
    pod_patch = {
        "terminationGracePeriodSeconds": TERM_GRACE_S,
        "volumes": volumes,
        "containers": [{"name": TRAINJOB_NODE, "volumeMounts": mounts}],
    }
    patch = {"manager": "trainforge", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": TRAINJOB_NODE, "template": {"spec": {"template": {"spec": pod_patch}}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": spec.k8s_runtime}, "trainer": trainer, "runtimePatches": [patch]}}


# ------------------------------------------------------------------ skypilot


@LAUNCHERS.register("skypilot")
def render_skypilot(spec: JobSpec) -> str:
    """A SkyPilot task: `sky launch FILE` (or `sky jobs launch FILE` to recover from preemptions).

    Every node writes the embedded recipe and runs torchrun with the head node (first line of
    $SKYPILOT_NODE_IPS) as the rendezvous endpoint. With `bucket`, the run directory lives in the
    bucket mounted at /runs, so a managed job that SkyPilot restarts on new nodes resumes.
    """
    if spec.elastic:
        _bad("min_nodes", "SkyPilot starts a fixed num_nodes; drop --min-nodes/--max-nodes and use --nodes")
    if spec.spot and spec.bucket is None:
        _bad("bucket", "a spot job needs a bucket for its checkpoints (a recovered job gets new disks); "
                       "pass e.g. --bucket s3://my-bucket/runs")  # fmt: skip
    config_path = "$HOME/.trainforge/" + spec.slug + ".yaml"
    run_dir = run_dir_for(spec, SKYPILOT_RUNS_MOUNT if spec.bucket else "runs")
    nproc = str(spec.nproc) if spec.cpu_only or spec.procs_per_node else '"$SKYPILOT_NUM_GPUS_PER_NODE"'
    train = _train_args(f'"{config_path}"', shlex.quote(run_dir), nproc,
                        '"$SKYPILOT_NUM_NODES"', f'"$head_node:{spec.port}"', spec)  # fmt: skip
    run = [
        "set -euo pipefail",
        *_cpu_env_lines(spec),
        'mkdir -p "$HOME/.trainforge"',
        *_write_config_lines(f'"{config_path}"', spec),
        'head_node=$(echo "$SKYPILOT_NODE_IPS" | sed -n 1p)',  # sed, not head: no SIGPIPE under pipefail
        _shell_command(train),
    ]
    resources: dict[str, Any] = {
        **({"accelerators": f"{spec.accelerator}:{spec.gpus_per_node}"} if not spec.cpu_only else {}),
        "cpus": f"{spec.cpus_per_node}+",
    }
    if spec.mem_per_node_gib:
        resources["memory"] = f"{spec.mem_per_node_gib}+"
    if spec.spot:
        resources["use_spot"] = True
    task: dict[str, Any] = {"name": spec.slug, "num_nodes": spec.nodes, "resources": resources}
    if spec.env:
        task["envs"] = dict(spec.env)
    if spec.bucket:
        task["file_mounts"] = {SKYPILOT_RUNS_MOUNT: {"source": spec.bucket, "mode": "MOUNT"}}
    task["setup"] = spec.setup if spec.setup.endswith("\n") else spec.setup + "\n"
    task["run"] = "\n".join(run) + "\n"
    return _dump_yaml(task)
