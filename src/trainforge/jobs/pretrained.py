"""Pretrained models a submission names: folders and files under the data roots, hub ids already in the cache.

    found = confine_pretrained(cfg, roots, allow_hub_downloads=False)   # [(field, real path)], or UserError
    env = hub_env(allow_hub_downloads=False)   # HF_HUB_OFFLINE=1 ...: for the size check and the job processes

The fields: `model.args.pretrained` and `model.args.config` (model `hf`: a hub id, a folder that
save_pretrained wrote, or an inline mapping), `model.args.pretrained` and `model.args.arch` (model `timm`:
true, false or a weights file; a timm name), `model.args.weights` (model `resnet`: a torchvision weight-set
name or a state-dict file) and `data.from_model.source` / `.weights` (whose tokenizer or preprocessing the
data uses). Each is judged here, before anything is loaded:

- A value that looks like a path (absolute, starting with `~` or `.`, or with more than the one `/` of
  `org/name`) is confined to the data roots like `data.path` (`confine.confine`: absolute, lexically
  inside, then inside with symbolic links resolved) and replaced by its real path in the frozen config. In a
  folder, no file may be a link leading out, and the files that tell transformers what to build
  (`config.json`, `*.index.json`, processor configs) may name no file outside it (an absolute path, `~`,
  `..`, `local-dir:/...`): a timm backbone named `local-dir:/home/alice/model` would be read otherwise.
- Anything else must be a hub id (`name` or `org/name`: letters, digits, `.`, `_`, `-`, at most 96 per
  part, no `..` or `--`, not ending in `.git`) or a timm / torchvision name (one such part). Unless the
  operator started the server with `--allow-hub-downloads`, a hub id must already be in the server's
  Hugging Face cache (torchvision's and timm's URL weights: in torch's hub cache), and the size check and
  the jobs run with HF_HUB_OFFLINE=1, so a submission never makes the server download. Downloads, when
  allowed, are anonymous: the server user's Hugging Face token is never used for a submitter.
- An inline config (a mapping) may name no file either, by the same rule.

Relative values never reach a file of the server's: the size check and the jobs run in a folder of their own
(`sizing`, `runner`), so a hub id that happens to be the name of a folder in the server's working directory
is still a hub id.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from trainforge.config import Config
from trainforge.confine import confine, confine_tree
from trainforge.errors import UserError, quote
from trainforge.weights import WEIGHT_SET, Source, from_model_sources, sources

HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"  # huggingface_hub's rule, ASCII only
HUB_ID = re.compile(rf"{HUB_PART}(?:/{HUB_PART})?")
NAME = re.compile(HUB_PART)  # a timm architecture (with its tag) or a torchvision one
HUB_GRAMMAR = "name or org/name of letters, digits, '.', '_' and '-'"
DOWNLOAD_FLAG = "--allow-hub-downloads"
HUB_SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # never passed on to a check or a job
CACHE_MARKERS = ("config.json", "tokenizer_config.json", "tokenizer.json")  # one of them: the repo is cached
CONFIG_FILES = ("config.json", "preprocessor_config.json", "processor_config.json")  # + *.index.json
INERT_KEYS = ("_name_or_path", "id2label", "label2id")  # names only: never opened
MAX_CONFIG_BYTES = 16 * 2**20
MAX_CONFIG_VALUES = 100_000
_PREFIXED_PATH = re.compile(r":[/~]")  # local-dir:/x, file:///x


def hub_env(allow_hub_downloads: bool) -> dict[str, str]:
    """Environment for the size check and the job processes: offline unless the operator allowed downloads."""
    env = {"HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"}
    if not allow_hub_downloads:
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def apply_hub_env(env: dict[str, str]) -> None:
    """Set `env` in this process (the size check), also where huggingface_hub has already read it."""
    os.environ.update(env)
    for name in HUB_SECRET_ENV:
        os.environ.pop(name, None)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # it reads the environment once, at import
        constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = True
        if env.get("HF_HUB_OFFLINE") == "1":
            constants.HF_HUB_OFFLINE = True


def looks_like_path(value: str) -> bool:
    """How the loaders would read it: absolute, home-relative, dot-relative, or more than org/name."""
    return value.startswith(("/", "~", ".")) or "\\" in value or "\0" in value or value.count("/") > 1


def is_hub_id(value: str) -> bool:
    return (HUB_ID.fullmatch(value) is not None and ".." not in value and "--" not in value
            and not value.endswith(".git"))


def confine_pretrained(cfg: Config, roots: Sequence[Path], *, allow_hub_downloads: bool) -> list[tuple[str, str]]:
    """(field, real path) of every pretrained folder or file `cfg` names, each confined to `roots`; hub ids are
    checked against the grammar and, downloads off, the local caches. UserError naming the field otherwise."""
    check = _Check(tuple(roots), allow_hub_downloads)
    for source in (*sources(cfg.model.name, cfg.model.args), *from_model_sources(cfg.data.from_model)):
        check.source(source)
    return check.found


class _Check:
    def __init__(self, roots: tuple[Path, ...], allow_hub_downloads: bool) -> None:
        self.roots = roots
        self.allow_hub_downloads = allow_hub_downloads
        self.found: list[tuple[str, str]] = []

    def source(self, source: Source) -> None:
        """One thing a model family or data.from_model declares it loads (trainforge/weights.py), by its kind."""
        field, value = source.field, source.value
        if source.kind == "hf":
            self.hf(field, value)
        elif source.kind == "inline":
            where = _names_a_file(value)
            if where is not None:
                raise UserError(f"{field}{where}: an inline config may not name files on the server (an absolute path, "
                                "~, .. or a prefix like local-dir:/); put the model in a folder under a data root and "
                                "name that folder in model.args.pretrained", public=True)
        elif source.kind == "file":
            self.file(field, value)
        elif source.kind == "name":
            self.name(field, value, f"a {source.library or 'model'} model name")
        elif source.kind == "timm":
            self.name(field, value, "a timm model name")
            if not self.allow_hub_downloads:
                self.timm_cached(field, value)
        elif source.kind == "torchvision":
            if not WEIGHT_SET.fullmatch(value):
                self.file(field, value)
            elif not self.allow_hub_downloads:
                self.torchvision_cached(field, source.arch, value)
        else:
            raise AssertionError(f"{field}: a source of unknown kind {source.kind!r}")

    def hf(self, field: str, value: str) -> None:
        """A transformers source: a folder under the roots, or a hub id (cached, unless downloads are allowed)."""
        if looks_like_path(value):
            real = confine(value, field, self.roots)
            if not real.is_dir():
                raise UserError(f"{field}: {quote(value)} is not a folder; point it at a folder that save_pretrained "
                                "wrote, under a data root", public=True)
            self._folder(real, field)
            self.found.append((field, str(real)))
            return
        if not is_hub_id(value):
            raise UserError(f"{field}: {quote(value)} is neither a hub id ({HUB_GRAMMAR}) nor an absolute path under "
                            "a data root", public=True)
        if not self.allow_hub_downloads and not in_hub_cache(value):
            raise UserError(f"{field}: {quote(value)} is not in this server's Hugging Face cache, and the job server "
                            f"downloads nothing for a submission; ask its operator to run `hf download {value}` on the "
                            f"server (or to start it with {DOWNLOAD_FLAG}), or point {field} at a folder under a "
                            "data root", public=True)

    def file(self, field: str, value: str) -> None:
        real = confine(value, field, self.roots)
        if not real.is_file():
            raise UserError(f"{field}: {quote(value)} is not a file; point it at a weights file under a data root",
                            public=True)
        self.found.append((field, str(real)))

    def name(self, field: str, value: str, what: str) -> None:
        if NAME.fullmatch(value) is None or ".." in value:
            raise UserError(f"{field}: {quote(value)} is not {what} (letters, digits, '.', '_' and '-'; no prefix "
                            "such as hf-hub: or local-dir:)", public=True)

    def timm_cached(self, field: str, arch: str) -> None:
        """timm's own weights for `arch`: from the Hugging Face cache (or torch's, for the older URL weights)."""
        import timm  # heavy (~1 s): only timm recipes with pretrained: true load it

        try:
            pretrained = timm.models.get_pretrained_cfg(arch)
        except RuntimeError:  # an unknown tag of a known architecture
            pretrained = None
        if pretrained is None:
            if timm.is_model(arch):
                raise UserError(f"{field}: timm has no pretrained weights for {quote(arch)}; use false or a weights "
                                "file under a data root", public=True)
            return  # not a timm model at all: the model's own check says so, with similar names
        hub_id = (pretrained.hf_hub_id or "").split("@")[0]
        if hub_id and is_hub_id(hub_id):
            if in_hub_cache(hub_id, ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")):
                return
            where, fix = "Hugging Face cache", f"to run `hf download {hub_id}` on the server"
        elif pretrained.url:
            file = pretrained.url.rsplit("/", 1)[-1]
            if (torch_hub_checkpoints() / file).is_file():
                return
            where, fix = "torch hub cache", f"to put {file} in the server's $TORCH_HOME/hub/checkpoints"
        else:
            raise UserError(f"{field}: timm names no source for the weights of {quote(arch)}; use a weights file "
                            "under a data root", public=True)
        raise UserError(f"{field}: timm's weights for {quote(arch)} are not in this server's {where}, and the job "
                        f"server downloads nothing for a submission; ask its operator {fix} (or to start it with "
                        f"{DOWNLOAD_FLAG}), or set {field} to a weights file under a data root", public=True)

    def torchvision_cached(self, field: str, arch: Any, weights: str) -> None:
        """A torchvision weight set, which torch's hub cache must hold (it would be downloaded otherwise)."""
        import torchvision  # admission has it loaded already (the model zoo)

        if not isinstance(arch, str):
            return  # the model refuses weights without a torchvision arch
        try:
            sets = torchvision.models.get_model_weights(arch)
        except (ValueError, KeyError):
            return  # not a torchvision model: the model's own check lists the archs
        names = [w.name for w in sets]
        if weights != "DEFAULT" and weights not in names:
            raise UserError(f"{field}: {quote(weights)} is not a weight set of {arch}; choose DEFAULT, "
                            f"{', '.join(names)} or a state-dict file under a data root", public=True)
        chosen = sets.DEFAULT if weights == "DEFAULT" else sets[weights]
        file = chosen.url.rsplit("/", 1)[-1]
        if not (torch_hub_checkpoints() / file).is_file():
            raise UserError(f"{field}: torchvision's {arch} {chosen.name} weights are not in this server's torch hub "
                            f"cache, and the job server downloads nothing for a submission; ask its operator to put "
                            f"{file} in the server's $TORCH_HOME/hub/checkpoints (or to start it with {DOWNLOAD_FLAG}), "
                            f"or point {field} at a state-dict file under a data root", public=True)

    def _folder(self, folder: Path, field: str) -> None:
        """Every file in a pretrained folder lies under the roots, and its configs name no file outside it."""
        confine_tree(folder, field, self.roots)
        for path in sorted(folder.iterdir()):
            if path.is_file() and (path.name in CONFIG_FILES or path.name.endswith(".index.json")):
                self._config_file(path, field)

    def _config_file(self, path: Path, field: str) -> None:
        # the file may be another user's (data roots are shared): the public line quotes none of it
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"{field}: {path.name} in it is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config is a "
                            "few KiB", public=True)
        try:
            doc = json.loads(path.read_bytes())
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise UserError(f"{field}: {path.name} in it is not valid JSON", public=True) from None
        except OSError as e:
            raise UserError(f"{field}: cannot read {path.name} in it ({e.strerror})", public=True) from None
        where = _names_a_file(doc)
        if where is not None:
            raise UserError(f"{field}: {path.name} in it names a file outside the folder at {where or 'its top'}",
                            public=f"{field}: {path.name} in it names a file outside the folder (an absolute path, ~, "
                                   ".. or a prefix like local-dir:/); a pretrained folder may name only files of its own")


def _names_a_file(doc: Any) -> Optional[str]:
    """The key path (".a.b[0]") of the first string in `doc` that would name a file outside a folder however a
    loader reads it (absolute, ~, a .. segment, a prefix:/path), or None. Too large a document counts as one."""
    stack: list[tuple[str, Any]] = [("", doc)]
    seen = 0
    while stack:
        where, node = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            return where
        if isinstance(node, str):
            if (node.startswith(("/", "~")) or _PREFIXED_PATH.search(node) is not None
                    or ".." in re.split(r"[/:\\]", node)):
                return where
        elif isinstance(node, dict):
            stack.extend((f"{where}.{k}", v) for k, v in node.items() if k not in INERT_KEYS)
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
    return None


def in_hub_cache(repo_id: str, files: Sequence[str] = CACHE_MARKERS) -> bool:
    """One of `files` of the repo's main revision is in the local Hugging Face cache (nothing is fetched)."""
    from huggingface_hub import try_to_load_from_cache  # light next to torch; only for hub ids

    try:
        return any(isinstance(try_to_load_from_cache(repo_id, f), str) for f in files)
    except ValueError:  # HFValidationError: an id the hub itself would refuse is in no cache
        return False


def torch_hub_checkpoints() -> Path:
    import torch  # admission has it loaded already

    return Path(torch.hub.get_dir()) / "checkpoints"
