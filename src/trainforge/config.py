"""The typed recipe: pydantic models, YAML loading, dotted KEY=VALUE overrides.

    cfg = load_config("recipes/digits_cnn.yaml", ["optim.lr=3e-4", "train.epochs=2"])

Every section forbids unknown keys. All user mistakes surface as `UserError` with one line that
names the field and the fix, e.g. ``optim.lr: expected a number, got 'fast'``.
"""
from __future__ import annotations

import importlib.resources
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainforge.errors import HIDDEN_CATEGORIES, UserError, printable, quote
from trainforge.files import Unreadable, read_regular
from trainforge.weights import preprocessing_source

DEFAULT_RECIPE = "digits_cnn"
# Upper bounds on counts: far above any real run, low enough that every later product (steps x batch,
# a database column, a sleep) stays a sane integer. A bigger value is a typo.
MAX_STEPS = 10**12
MAX_EPOCHS = 10**6
MAX_BATCH = 10**7
MAX_COUNT = 10**6  # patience, checkpoints kept, workers, threads, log interval
MAX_SEED = 2**63 - 1


class Section(BaseModel):
    # allow_inf_nan=False: every float setting is finite (optim.lr=.inf is a mistake, not a setting)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class AugmentConfig(Section):
    """Train-split augmentation; all off by default. Images: torchvision.transforms.v2 ops; text
    classification: the token_* ops (trainforge.data.stages.augment.TextAugment)."""

    rotation_deg: float = Field(0.0, ge=0, le=180)
    crop_scale: Optional[tuple[float, float]] = None  # RandomResizedCrop scale range, e.g. [0.8, 1.0]
    hflip: float = Field(0.0, ge=0, le=1)  # probability
    vflip: float = Field(0.0, ge=0, le=1)
    color_jitter: float = Field(0.0, ge=0, le=1)  # brightness/contrast/saturation strength
    dflip: float = Field(0.0, ge=0, le=1)  # volumes: probability of a flip along the depth (slice) axis
    intensity_shift: float = Field(0.0, ge=0, le=1)  # volumes: add one offset drawn from [-v, v] to every voxel
    token_crop: Optional[float] = Field(None, gt=0, le=1)  # text: keep a random window of >= this fraction
    token_dropout: float = Field(0.0, ge=0, le=0.5)  # text: probability each token is deleted
    token_mask: float = Field(0.0, ge=0, le=0.5)  # text: probability each token becomes the pad id
    # point clouds (OpenPCDet's random_world_*): the whole frame, points and boxes together
    world_rotation_deg: float = Field(0.0, ge=0, le=180)  # a turn about z drawn from [-v, v] degrees
    world_scaling: Optional[tuple[float, float]] = None  # a scale drawn from [low, high], e.g. [0.95, 1.05]
    world_flip: float = Field(0.0, ge=0, le=1)  # probability of mirroring across the x axis (y -> -y)
    # ground-truth sampling (SECOND's; OpenPCDet's gt_sampling): objects of the train split pasted into each training
    # frame until it holds this many of each class, e.g. {Car: 15, Pedestrian: 10}; before the world ops
    gt_sampling: Optional[dict[str, int]] = None
    gt_min_points: int = Field(5, ge=1, le=100_000)  # objects with fewer points are not pasted

    @field_validator("gt_sampling")
    @classmethod
    def _gt_sampling(cls, v: Optional[dict[str, int]]) -> Optional[dict[str, int]]:
        if v is not None and not all(isinstance(n, int) and 0 <= n <= 1000 for n in v.values()):
            raise ValueError(f"give each class the objects a frame should hold, 0 to 1000, got {v}")
        return v

    @field_validator("world_scaling")
    @classmethod
    def _world_scaling(cls, v: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
        if v is not None and not (0 < v[0] <= v[1] <= 10):
            raise ValueError(f"need 0 < low <= high <= 10, got {list(v)}")
        return v

    @field_validator("crop_scale")
    @classmethod
    def _scale_range(cls, v: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
        if v is not None and not (0 < v[0] <= v[1] <= 1):
            raise ValueError(f"need 0 < low <= high <= 1, got {list(v)}")
        return v


class CleanConfig(Section):
    dedup: bool = True  # drop exact duplicate samples (content hash)
    drop_nonfinite: bool = True  # drop rows with NaN/inf features


class TokenizerArgsConfig(Section):
    """Settings of `data.tokenizer: bpe` (a byte-level BPE trained on the training split with `tokenizers`)."""

    vocab_size: int = Field(8000, ge=300, le=1_000_000)  # including the 4 special tokens; >= the 256 bytes
    min_frequency: int = Field(2, ge=1, le=MAX_COUNT)  # a merge must occur this often in the training split


class FromModelConfig(Section):
    """Whose tokenizer (`data.tokenizer: model`) or image preprocessing (`data.normalize: model`) the data uses.
    Filled from the model section when left out: hf -> model.args.pretrained (or a config id/dir), timm ->
    model.args.arch, the zoo's resnet with torchvision weights -> model.args.arch and model.args.weights."""

    family: Literal["hf", "timm", "torchvision"]
    source: str = Field(min_length=1, max_length=1000)  # hf: hub id or directory; timm/torchvision: arch name
    weights: Optional[str] = Field(None, max_length=1000)  # torchvision: the weight set (DEFAULT, IMAGENET1K_V1)
    trust_remote_code: bool = False  # hf: its tokenizer or processor may run its own code (model.args's, when filled)


class DataConfig(Section):
    task: Optional[str] = None  # the recipe's `task:` (Config wires it here: the data stage sees only data.*)
    source: str = "digits"
    path: Optional[str] = None  # file or folder for imagefolder/csv/jsonl/textfile
    target: Optional[str] = None  # "pkg.module:factory" when source is custom
    args: dict[str, Any] = Field(default_factory=dict)  # source-specific arguments
    download: bool = False  # torchvision datasets only; never implicit
    val_fraction: float = Field(0.15, ge=0, lt=1)
    test_fraction: float = Field(0.2, ge=0, lt=1)
    # images and tabular data: fitted on the train split (zscore, minmax) or none; images: model = resized, cropped
    # and normalized as data.from_model expects (trainforge.data.image.preprocess), stored with the run
    normalize: Literal["zscore", "minmax", "none", "model"] = "zscore"
    # text: None = the source's own (bytes for jsonl, raw_bytes for textfile); model = data.from_model's
    # tokenizer (AutoTokenizer); bpe = trained on the training split, stored with the run
    tokenizer: Optional[Literal["bytes", "raw_bytes", "model", "bpe"]] = None
    tokenizer_args: TokenizerArgsConfig = Field(default_factory=TokenizerArgsConfig)
    from_model: Optional[FromModelConfig] = None
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    # a column (an index's, a table's, a record's key) whose value names each sample's group, e.g. patient_id:
    # every sample of a group lands in one split (no patient in train and test)
    group_by: Optional[str] = Field(None, min_length=1, max_length=200)
    num_workers: Union[int, Literal["auto"]] = "auto"
    # an index (.csv, .jsonl, .parquet) is read in batches within these bounds, checked before memory is spent
    max_index_rows: int = Field(2_000_000, ge=1, le=10**10)
    max_field_bytes: int = Field(1 << 20, ge=1024, le=1 << 31)  # one CSV field, one JSONL line, one Parquet value

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, v: Union[int, str]) -> Union[int, str]:
        if isinstance(v, int) and not 0 <= v <= MAX_COUNT:
            raise ValueError(f"must be 0..{MAX_COUNT} or 'auto', got {v}")
        return v

    @model_validator(mode="after")
    def _fractions(self) -> "DataConfig":
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                "data.val_fraction + data.test_fraction must leave at least 10% for training"
            )
        return self


class LoraConfig(Section):
    """LoRA adapters (PEFT) on the model's Linear layers; every other weight frozen. `target_modules`: module
    names (the last part of a dotted name, e.g. q_proj, v_proj) or "all-linear" (every Linear but the output
    head)."""

    r: int = Field(8, gt=0, le=1024)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: Union[Literal["all-linear"], list[str]] = Field(
        default_factory=lambda: ["q_proj", "v_proj"])

    @field_validator("target_modules")
    @classmethod
    def _named(cls, v: Union[str, list[str]]) -> Union[str, list[str]]:
        if isinstance(v, list) and (not v or not all(isinstance(n, str) and n.strip() for n in v)):
            raise ValueError('name one module or more (e.g. [q_proj, v_proj]), or "all-linear"')
        return v


class ModelConfig(Section):
    name: str = "cnn"
    target: Optional[str] = None  # "pkg.module:factory" when name is custom
    args: dict[str, Any] = Field(default_factory=dict)
    lora: Optional[LoraConfig] = None  # LoRA adapters on a pretrained hf model; the base stays frozen
    # QLoRA: the frozen base's Linear weights in the transformer blocks quantized (torchao), under model.lora
    quantize_base: Literal["nf4", "int8", "none"] = "none"

    @model_validator(mode="after")
    def _quantize_needs_lora(self) -> "ModelConfig":
        if self.quantize_base != "none" and self.lora is None:
            raise ValueError(f"model.quantize_base: quantizing the frozen base needs model.lora; add model.lora "
                             f"(e.g. model.lora={{r: 8, alpha: 16}}) or set model.quantize_base=none "
                             f"(got {self.quantize_base})")
        return self


class ParamGroupConfig(Section):
    """Parameters whose names match (a glob, or a regex after "re:") get their own LR and/or weight decay."""

    match: str = Field(min_length=1, max_length=200)
    lr: Optional[float] = Field(None, gt=0)  # scheduled like optim.lr: same warmup and decay, this peak
    weight_decay: Optional[float] = Field(None, ge=0)  # replaces both optim.weight_decay and the no-decay rule


class OptimConfig(Section):
    name: str = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    param_groups: list[ParamGroupConfig] = Field(default_factory=list, max_length=64)  # first match wins
    layer_decay: Optional[float] = Field(None, gt=0, le=1)  # LR x decay^(depth from the top) per layer
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = Field(0.9, ge=0, lt=1)  # sgd
    nesterov: bool = False  # sgd
    eps: float = Field(1e-8, gt=0)


class ScheduleConfig(Section):
    name: str = "cosine"
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)  # floor of cosine/linear decay, as a fraction of lr
    step_size: int = Field(1000, gt=0, le=MAX_STEPS)  # "step": decay every step_size optimizer steps
    gamma: float = Field(0.1, gt=0, le=1)  # "step": multiply by gamma


class EarlyStoppingConfig(Section):
    metric: Optional[str] = None  # a val metric the task reports (`trainforge tasks`); None: the task's default
    mode: Optional[Literal["min", "max"]] = None  # None: the direction the metric improves in (the task says)
    patience: int = Field(5, gt=0, le=MAX_COUNT)  # evaluations without improvement
    min_delta: float = Field(0.0, ge=0)


class TrainConfig(Section):
    epochs: int = Field(10, gt=0, le=MAX_EPOCHS)
    max_steps: Optional[int] = Field(None, gt=0, le=MAX_STEPS)  # overrides epochs when set
    global_batch_size: int = Field(64, gt=0, le=MAX_BATCH)
    micro_batch_size: Union[int, Literal["auto"]] = 64
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False
    deterministic: bool = False
    device: str = "auto"
    eval_every_steps: Optional[int] = Field(None, gt=0, le=MAX_STEPS)  # default: once per epoch
    checkpoint_every_steps: Optional[int] = Field(None, gt=0, le=MAX_STEPS)  # default: once per epoch
    keep_checkpoints: int = Field(3, gt=0, le=MAX_COUNT)
    grad_clip_norm: Optional[float] = Field(1.0, gt=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    # the task's named training loss (segmentation: cross_entropy | dice | dice_ce | focal); null: the task's own
    loss: Optional[str] = Field(None, max_length=64)
    # classification: weights of the classes in the training loss; auto = n / (classes x count) over the train split
    # (rare classes weigh more, as scikit-learn's "balanced"), or one positive weight per class in class order
    class_weights: Union[None, Literal["auto"], list[float]] = Field(None, max_length=100_000)
    ema_decay: Optional[float] = Field(None, gt=0, lt=1)
    early_stopping: Optional[EarlyStoppingConfig] = None
    max_bad_steps: int = Field(5, gt=0, le=MAX_COUNT)  # non-finite losses in a row before the run stops
    freeze: list[str] = Field(default_factory=list, max_length=64)  # parameter names (globs, or "re:<regex>")
    channels_last: Union[bool, Literal["auto"]] = "auto"  # auto: CNN inputs on CUDA
    log_every_steps: int = Field(10, gt=0, le=MAX_STEPS)
    num_threads: Optional[int] = Field(None, gt=0, le=MAX_COUNT)  # CPU intra-op threads
    memory_budget_bytes: Optional[int] = Field(None, gt=0, le=2**60)  # CPU budget for micro_batch_size: auto
    activation_checkpointing: bool = False  # recompute each repeated block's activations in backward

    @field_validator("micro_batch_size")
    @classmethod
    def _micro(cls, v: Union[int, str]) -> Union[int, str]:
        if isinstance(v, int) and not 0 < v <= MAX_BATCH:
            raise ValueError(f"must be an integer in 1..{MAX_BATCH} or 'auto', got {v}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        kind = v.split(":", 1)[0]
        valid = ("auto", "cpu", "cuda", "mps", "xpu", "npu")
        if kind not in valid:
            raise ValueError(f"expected one of {', '.join(valid)} (optionally with :N), got {quote(v)}")
        return v


class DistributedConfig(Section):
    strategy: Literal["auto", "none", "ddp", "fsdp"] = "auto"  # auto: ddp with more than one process


class MlflowConfig(Section):
    """`log.mlflow`: log the run to MLflow (docs/tracking.md). Set (even as `{}`) to enable."""

    tracking_uri: Optional[str] = None  # default: $MLFLOW_TRACKING_URI, else sqlite:///<log.runs_root>/mlflow.db
    experiment: Optional[str] = None  # default: the recipe's name
    register_model: Optional[str] = None  # register the final model under this name
    sync_every_s: float = Field(30.0, gt=0, le=86400)  # how often a running run's new rows go to the tracker


class LogConfig(Section):
    tensorboard: bool = True
    progress: bool = True  # rich progress bar on stderr
    # report.html when the run ends (its charts take about a second to draw); `trainforge runs report RUN` writes
    # it later, from the run directory alone
    report: bool = True
    runs_root: str = "runs"  # parent of runs/<name>-<timestamp>/ when --run-dir is not given
    mlflow: Optional[MlflowConfig] = None  # off unless set


class StageConfig(Section):
    """What one of trainforge's own stages records in a run it makes (not a recipe's to set): read back on resume."""

    # `trainforge compress`'s fine-tuning run of a pruned model: the weights are this architecture with channels
    # removed, and loading resizes its layers to them
    pruned: bool = False
    mlflow_parent_run_id: Optional[str] = None  # `trainforge tune`: the study's MLflow run, each trial its child


INTERNAL_SECTION = "stage"  # Config.stage: written by trainforge's own stages, read back from stored configs only


class Config(Section):
    name: str = "run"
    task: Optional[str] = None  # a task in trainforge.tasks (`trainforge tasks`); None: the data source's default
    seed: int = Field(0, ge=0, le=MAX_SEED)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    stage: StageConfig = Field(default_factory=StageConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or any(c in v for c in "/\\\0") or v.startswith(".") or len(v.encode("utf-8", "surrogatepass")) > 100:
            raise ValueError(f"must be a plain name usable in a folder name (at most 100 bytes), got {quote(v)}")
        hidden = next((c for c in v if unicodedata.category(c) in HIDDEN_CATEGORIES), None)
        if hidden is not None:  # a name is shown in tables, logs and folder listings: nothing in it may act or hide
            raise ValueError(f"{describe_character(hidden)} in the name; a name holds printable characters only "
                             f"(no tabs or newlines either), got {quote(v)}")
        return v

    @model_validator(mode="after")
    def _task_to_data(self) -> "Config":
        """The recipe's `task:` is what the data stage builds (it sees only data.*, so the recipe wires it here)."""
        if self.task is not None:
            if self.data.task not in (None, self.task):
                raise ValueError(f"task is {self.task!r} but data.task is {self.data.task!r}; set only `task:`")
            self.data.task = self.task
        return self

    @model_validator(mode="after")
    def _data_from_model(self) -> "Config":
        """`data.tokenizer: model` or `data.normalize: model` without data.from_model: the model section says
        which pretrained model it is (the data stage sees only data.*, so the recipe wires it here)."""
        if self.data.from_model is None:
            if self.data.tokenizer == "model":
                self.data.from_model = model_source(self.model, "data.tokenizer", "its tokenizer")
            elif self.data.normalize == "model":
                self.data.from_model = model_source(self.model, "data.normalize", "its image preprocessing")
        return self

    def to_yaml(self) -> str:
        """The config as config.yaml holds it. A `stage:` section at its defaults is left out: what a plain run
        writes is then a recipe again (a recipe may not set `stage:`, see refuse_internal_keys)."""
        exclude = {INTERNAL_SECTION} if self.stage == StageConfig() else None
        return yaml.safe_dump(self.model_dump(mode="json", exclude=exclude), sort_keys=False)


def model_source(model: ModelConfig, field: str = "data.tokenizer", what: str = "its tokenizer") -> FromModelConfig:
    """The pretrained model a model section names, for its tokenizer or preprocessing."""
    implied = preprocessing_source(model.name, model.args)  # each family declares it (trainforge/weights.py)
    if implied is not None:
        return FromModelConfig(**implied)
    raise ValueError(
        f"{field}: 'model' needs a pretrained model to take {what} from, and model.name {model.name!r} names none: "
        "use model.name hf with model.args.pretrained (or a config id or directory), timm with model.args.arch, or "
        "resnet with model.args.arch; or set data.from_model {family, source}"
    )


# ---------------------------------------------------------------- loading


def recipes_dir() -> Path:
    """Built-in recipes: the repo's recipes/ folder (editable install) or the packaged copy."""
    repo = Path(__file__).resolve().parents[2] / "recipes"
    if repo.is_dir():
        return repo
    return Path(str(importlib.resources.files("trainforge") / "recipes"))


def builtin_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.yaml"))}


def resolve_recipe(recipe: Optional[str]) -> Path:
    """A path to a YAML file, or the name of a built-in recipe; None means the default recipe."""
    if recipe is None:
        recipe = DEFAULT_RECIPE
    path = Path(recipe)
    if path.is_file():
        return path
    builtin = builtin_recipes()
    if recipe in builtin:
        return builtin[recipe]
    if path.suffix in (".yaml", ".yml") or "/" in recipe:
        raise UserError(f"{recipe}: recipe file not found; give a path to a YAML file or one of: {', '.join(builtin)}")
    raise UserError(f"{recipe}: no such recipe; give a path to a YAML file or one of: {', '.join(builtin)}")


RECIPE_MAPPING = "a recipe must be a YAML mapping of sections (data, model, optim, ...)"
MAX_YAML_BYTES = 1 << 20  # a recipe, search space or catalog file; real ones are a few KiB
MAX_YAML_NODES = 100_000  # values in the document with every alias expanded (an alias bomb is refused)
MAX_YAML_DEPTH = 64  # nesting of mappings and lists; recipes need about 5
MAX_INT_CHARS = 100  # digits of a YAML integer: settings need at most ~20 (int() refuses more than 4300)
# What no config string or key may hold: control characters (C0 but tab, newline and carriage return, which text
# such as a chat template has; DEL; C1) and lone surrogates (a Python str can hold one, no file or terminal can)
FORBIDDEN_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def read_yaml(path: Path, expected: str = RECIPE_MAPPING, *, allow_empty: bool = False,
              follow_links: bool = True) -> dict[str, Any]:
    """A YAML file that must hold a mapping; every problem is one UserError naming the file (and line). A FIFO or a
    device is refused at once, never waited on; `follow_links=False` for a file someone else wrote (a run dir)."""
    try:
        data, _, _ = read_regular(Path(path), MAX_YAML_BYTES + 1, follow_links=follow_links)
    except Unreadable as e:
        raise UserError(f"{path}: {e}; pass a YAML file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror}); check the path") from None
    if len(data) > MAX_YAML_BYTES:
        raise UserError(f"{path}: larger than {MAX_YAML_BYTES >> 10} KiB; a YAML file here is a few KiB of settings")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    return parse_yaml_mapping(text, str(path), expected, allow_empty=allow_empty)


def parse_yaml_mapping(text: str, source: str, expected: str = RECIPE_MAPPING, *,
                       allow_empty: bool = False) -> dict[str, Any]:
    """YAML text that must hold a mapping; errors name `source` (and the line). Empty text is an error
    unless `allow_empty` (then {})."""
    raw = load_yaml_text(text, source)
    if raw is None:
        if allow_empty:
            return {}
        raise UserError(f"{source}: empty; {expected}")
    if not isinstance(raw, dict):
        raise UserError(f"{source}: {expected}")
    return raw


def load_yaml_text(text: str, source: str) -> Any:
    """yaml.safe_load, hardened for text from anyone: bounded size, nesting and alias expansion, and a
    key given twice in one mapping is an error (not "the last one wins"); a character YAML refuses (a control
    character, a lone surrogate) or a value its tag cannot be (an invalid date, a 5000-digit integer) is an
    error too. Errors name `source` (and the line)."""
    if len(text) > MAX_YAML_BYTES:
        raise UserError(f"{source}: larger than {MAX_YAML_BYTES >> 10} KiB; a YAML document here is a few KiB of settings")
    try:
        loader = _BoundedLoader(text)  # the reader refuses characters YAML does not allow, before parsing
    except yaml.reader.ReaderError as e:
        raise UserError(f"{source}:{_line_of(text, e.position)} {describe_character(chr(e.character))} in the text; "
                        "YAML text holds printable characters, tabs and newlines only; remove it") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_graph(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{source}:{where} malformed YAML ({getattr(e, 'problem', None) or e}); fix the syntax") from None
    except _BadValue as e:
        where = f" line {e.line}:" if "\n" in text.strip() else ""  # an override's value has one line
        raise UserError(f"{source}:{where} {e.problem}") from None
    except _TooDeep:
        raise UserError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels; a recipe needs a handful") from None
    finally:
        loader.dispose()


def _line_of(text: str, position: int) -> str:
    return f" line {text.count(chr(10), 0, position) + 1}:" if "\n" in text.strip() else ""


def describe_character(char: str) -> str:
    """A character that text from a user may not hold, named for an error message."""
    kind = unicodedata.category(char)
    if kind == "Cs":
        return f"a lone surrogate ({quote(char)}, half of a UTF-16 pair)"
    return f"a control character ({quote(char)})" if kind == "Cc" else f"an invisible character ({quote(char)})"


class _TooDeep(Exception):
    pass


class _BadValue(Exception):
    """A scalar its tag cannot be (PyYAML raises ValueError, KeyError, ... from deep in its constructors)."""

    def __init__(self, problem: str, node: yaml.Node) -> None:
        super().__init__(problem)
        self.problem, self.line = problem, node.start_mark.line + 1


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose (recursive) composer stops at MAX_YAML_DEPTH instead of exhausting the stack, and whose
    constructors answer a value they cannot build (`!!int x`, `2024-13-45`, an integer of 5000 digits) with
    _BadValue naming the line, not a traceback."""

    _depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _TooDeep()
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, _BadValue):
            raise
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as e:
            kind = node.tag.rsplit(":", 1)[-1]
            value = quote(node.value) if isinstance(node, yaml.ScalarNode) else f"this {node.id}"
            why = f" ({e})" if isinstance(e, ValueError) else ""
            raise _BadValue(f"{value} is not a valid {kind}{why}; fix it, or quote it to keep it as text", node) from None

    def construct_bounded_int(self, node: yaml.Node) -> int:
        digits = str(node.value).replace("_", "").lstrip("+-")
        digits = digits[2:] if digits[:2].lower() in ("0x", "0o", "0b") else digits
        if len(digits) > MAX_INT_CHARS:
            raise _BadValue(f"an integer of {len(digits)} digits; a setting has at most {MAX_INT_CHARS}", node)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)


def _check_yaml_graph(root: yaml.Node, source: str) -> None:
    """Walk the composed nodes once (iteratively, aliases visited once): expanded size, depth, duplicate keys."""
    size: dict[int, int] = {}  # id(node) -> values below it, aliases expanded
    depth: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        children = _yaml_children(node)
        if leaving:
            entered.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_YAML_NODES:
                raise UserError(f"{source}: expands to more than {MAX_YAML_NODES} values (YAML aliases); "
                                "write the values out or use fewer aliases")
            if depth[key] > MAX_YAML_DEPTH:  # through aliases: the composer saw each level once
                raise UserError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels; a recipe needs a handful")
            continue
        if key in size:
            continue
        if key in entered:
            raise UserError(f"{source}: line {node.start_mark.line + 1}: a YAML alias contains itself; remove the loop")
        entered.add(key)
        stack.append((node, True))
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(node, source)
        stack.extend((c, False) for c in children if id(c) not in size)


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _refuse_duplicate_keys(node: yaml.MappingNode, source: str) -> None:
    seen: set[str] = set()
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
            if k.value in seen:
                raise UserError(f"{source}: line {k.start_mark.line + 1}: key {quote(k.value)} appears twice in "
                                "one mapping; keep one")
            seen.add(k.value)


def parse_override(item: str) -> tuple[list[str], Any]:
    bad = FORBIDDEN_IN_TEXT.search(item)
    if bad is not None:  # checked on the raw text: str.strip() below would drop \x1c-\x1f from a key unseen
        key = item.partition("=")[0]
        if bad.start() < len(key):
            raise UserError(f"{quote(key)}: {describe_character(bad.group())} in the key; keys are dotted names like "
                            "train.epochs")
        raise UserError(f"{printable(key.strip())}: {describe_character(bad.group())} in the value; a setting holds "
                        "printable characters, tabs and newlines only; remove it")
    if "=" not in item:
        raise UserError(f"{quote(item)}: overrides are KEY=VALUE with a dotted key, e.g. optim.lr=3e-4")
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"{quote(item)}: empty key segment; use a dotted key like train.epochs=5")
    if len(parts) > MAX_YAML_DEPTH:
        raise UserError(f"{quote(key)}: more than {MAX_YAML_DEPTH} key segments; use a dotted key like train.epochs=5")
    try:
        value = load_yaml_text(text, key) if text.strip() else ""
    except UserError as e:
        if "malformed YAML" not in str(e):
            raise
        value = text  # not YAML: the text itself, which validation then judges
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`raw` with each KEY=VALUE of `overrides` set; one that names the internal `stage:` section (or a key that moved
    there) is refused, whatever `raw` is (see refuse_internal_keys)."""
    internal_old = {old for old, new in MOVED_KEYS if new[0] == INTERNAL_SECTION}
    for item in overrides:
        parts, value = parse_override(item)
        if parts[0] == INTERNAL_SECTION or tuple(parts) in internal_old:
            raise _internal_key(".".join(parts), "the overrides")
        set_dotted(raw, parts, value, label=item)
    return raw


def set_dotted(raw: dict[str, Any], parts: list[str], value: Any, label: str) -> dict[str, Any]:
    """raw[a][b][c] = value for parts [a, b, c], creating missing sections; `label` names the input in errors."""
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"{quote(label)}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = value
    return raw


_TYPE_WORDS = {
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
}


def format_validation_error(err: ValidationError) -> str:
    """The first problem as one line: `field.path: what is wrong and how to fix it`."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    kind = e["type"]
    got = e.get("input")
    if kind == "extra_forbidden":
        parent = _section_for(e["loc"][:-1])
        valid = ", ".join(parent.model_fields) if parent else ""
        return f"{loc}: unknown key; valid keys here: {valid}"
    if kind in _TYPE_WORDS:
        return f"{loc}: {_TYPE_WORDS[kind]}, got {quote(got)}"
    if kind == "finite_number":
        return f"{loc}: expected a finite number, got {quote(got)}"
    if kind in ("literal_error", "greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{loc}: {e['msg'].lower()}, got {quote(got)}"
    msg = e["msg"].removeprefix("Value error, ")
    if msg.startswith(("train.", "data.", "model.", "optim.")):
        return msg
    return f"{loc or 'config'}: {msg}"


def _section_for(loc: tuple) -> Optional[type[BaseModel]]:
    model: type[BaseModel] = Config
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def check_text(raw: Any) -> None:
    """No string or key in `raw` (a config as loaded) holds what FORBIDDEN_IN_TEXT matches; else UserError naming
    the dotted field. YAML's reader refuses such characters in the text, but a double-quoted "\\e" or "\\0" and a
    JSON body deliver them as values."""
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:
        field, value = stack.pop()
        if isinstance(value, str):
            bad = FORBIDDEN_IN_TEXT.search(value)
            if bad is not None:
                raise UserError(f"{field or 'config'}: {describe_character(bad.group())} in the value; a setting holds "
                                "printable characters, tabs and newlines only; remove it")
        elif isinstance(value, dict):
            for key, child in value.items():
                bad = FORBIDDEN_IN_TEXT.search(key) if isinstance(key, str) else None
                if bad is not None:
                    raise UserError(f"{field or 'config'}: the key {quote(key)} holds {describe_character(bad.group())}; "
                                    "keys are plain names")
                stack.append((f"{field}.{key}" if field else str(key), child))
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{field}.{i}", child) for i, child in enumerate(value))


# keys that moved to the section they belong to: (old path, new path). The old spelling keeps working, with a note.
MOVED_KEYS = (
    (("distributed", "activation_checkpointing"), ("train", "activation_checkpointing")),
    (("model", "pruned"), ("stage", "pruned")),
    (("log", "mlflow", "parent_run_id"), ("stage", "mlflow_parent_run_id")),
)
_noted: set[str] = set()


def migrate_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with every moved key at its new place (a one-line note on stderr, once per process and key); the same
    key given at both places with different values is an error naming both."""
    for old, new in MOVED_KEYS:
        parent: Any = raw
        for part in old[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old[-1] not in parent:
            continue
        old_name, new_name = ".".join(old), ".".join(new)
        value = parent.pop(old[-1])
        target: Any = raw
        for part in new[:-1]:
            if target.get(part) is None:
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                raise UserError(f"{old_name}: moved to {new_name}, but {part} is not a section; fix {part}")
        if new[-1] in target and target[new[-1]] != value:
            raise UserError(f"{old_name}: moved to {new_name}, which is given too with another value; keep {new_name}")
        target[new[-1]] = value
        if old_name not in _noted:
            _noted.add(old_name)
            sys.stderr.write(f"note: {old_name} is now {new_name}; the old spelling still works\n")
    return raw


def config_from_dict(raw: dict[str, Any]) -> Config:
    check_text(raw)
    if isinstance(raw, dict):
        raw = migrate_keys(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise UserError(format_validation_error(err)) from None


def refuse_internal_keys(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """`raw` (a recipe with its overrides, keys that moved already at their new place) when it sets nothing of the
    `stage:` section; else a UserError naming the first key. `trainforge compress` and `tune` record there what their
    own runs are (a pruned architecture, a study's MLflow run), and a config is read back with it on resume; a recipe
    that set it would build a model that its weights do not fit, or file its run under another study."""
    section = raw.get(INTERNAL_SECTION) if isinstance(raw, dict) else None
    if section is None:
        return raw
    keys = [f"{INTERNAL_SECTION}.{k}" for k in section] if isinstance(section, dict) and section else [INTERNAL_SECTION]
    raise _internal_key(keys[0], source)


def _internal_key(key: str, source: str) -> UserError:
    return UserError(f"{key}: set by trainforge's own stages (compress, tune) and read back from a run's stored "
                     f"config, never from a recipe or override; remove it from {source}")


def recipe_config(raw: dict[str, Any], overrides: list[str], source: str) -> Config:
    """The config of a user's recipe `raw` (parsed YAML) with KEY=VALUE `overrides`: the one way a recipe becomes a
    Config (the CLI, the Python API and the job server's admission)."""
    raw = apply_overrides(raw, list(overrides))
    if isinstance(raw, dict):
        refuse_internal_keys(migrate_keys(raw), f"{source} and its overrides" if overrides else source)
    return config_from_dict(raw)


def load_config(path: Optional[Union[str, Path]] = None, overrides: Optional[list[str]] = None) -> Config:
    """Load a recipe (a path or a built-in name; None = the default recipe) and apply overrides."""
    recipe = resolve_recipe(None if path is None else str(path))
    return recipe_config(read_yaml(recipe), list(overrides or []), f"the recipe {recipe.name}")


def config_from_yaml_text(text: str, source: str = "the stored config") -> Config:
    """Rebuild a config stored in a checkpoint or run directory."""
    return config_from_dict(parse_yaml_mapping(text, source, allow_empty=True))
