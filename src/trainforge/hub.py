"""Offline-first loading from the Hugging Face hub: a local directory, else the local cache, else the hub.

    config = from_hub(AutoConfig.from_pretrained, "bert-base-uncased", "config", field="model.args.pretrained")

The hub is asked only when the source is neither a local directory nor cached, never with
`HF_HUB_OFFLINE=1`, and only once one connection to it has succeeded (`hub_reachable`): on a machine without
network the libraries would otherwise retry for most of a minute before saying so. In a job of the server a local directory is checked against its data roots again
(`confine.local_path`). What cannot be found is one line (a UserError) naming the field, the id and how to
fetch it. Used by the `hf` models and by the data stage (the model's tokenizer and image preprocessing).

A model folder's own code (`auto_map` in its config.json, tokenizer_config.json or preprocessor_config.json, naming
.py files beside it) never runs unless the recipe opts in (`trust_remote_code`, passed to every loader explicitly:
transformers then neither runs it nor asks on the terminal). A folder that needs it without the opt-in is one line
saying so; with the opt-in, one warning names the files that will run.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar
from urllib.parse import urlsplit

from trainforge.confine import local_path
from trainforge.errors import UserError


HUB_CONNECT_TIMEOUT_S = 3.0


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("", "0", "false")


@functools.lru_cache(maxsize=None)
def hub_unreachable(endpoint: str) -> Optional[str]:
    """Why `endpoint` cannot be reached (name not resolved, connection refused or timed out), or None when one
    TCP connection to it succeeds. Asked once per process and endpoint."""
    url = urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return f"{host}:{port} could not be reached: {e.strerror or type(e).__name__}"
    return None


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def why_not_hub() -> Optional[str]:
    """Why the hub is not asked (HF_HUB_OFFLINE, or no connection to it), or None when it may be."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set, so the hub was not asked"
    return hub_unreachable(hub_endpoint())


REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
REMOTE_CODE_OPT_IN = "model.args.trust_remote_code"  # where a recipe opts in (data.from_model.trust_remote_code too)


def remote_code_files(folder: Path) -> list[str]:
    """The .py files a model folder's `auto_map` entries name (what transformers would import from it), sorted."""
    files: set[str] = set()
    for name in REMOTE_CODE_FILES:
        try:
            doc = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = doc.get("auto_map") if isinstance(doc, dict) else None
        for ref in (auto_map.values() if isinstance(auto_map, dict) else ()):
            for one in (ref if isinstance(ref, list) else [ref]):
                if isinstance(one, str) and "." in one:
                    module = one.split("--")[-1].rsplit(".", 1)[0]  # "repo--module.Class" or "module.Class"
                    files.add(module.replace(".", "/") + ".py")
    return sorted(files)


def needs_remote_code(error: BaseException) -> bool:
    """transformers' refusal of a folder or id whose classes are its own code, when trust_remote_code is False."""
    return isinstance(error, ValueError) and "trust_remote_code" in str(error)


def remote_code_refusal(source: str, field: str, files: list[str],
                        opt_in: str = f"unless the recipe opts in with {REMOTE_CODE_OPT_IN}: true (read the code "
                                      "first)") -> UserError:
    named = f" ({', '.join(files[:5])})" if files else ""
    text = "{field}: {source} loads only by running its own code{named}; trainforge never runs a model's code {opt_in}"
    # the job API's answer names no file of the folder: auto_map is the folder's content, not the submitter's words
    return UserError(text.format(field=field, source=source, named=named, opt_in=opt_in),
                     public=text.format(field=field, source=source, named="", opt_in=opt_in))


def use_modules_cache(folder: Path) -> None:
    """Where transformers copies a model's own code before importing it (HF_MODULES_CACHE): `folder`, private to
    this process, never the shared Hugging Face home, where one job's copied code would be importable by the next.
    Read by transformers at import, so an already imported one is pointed there too."""
    os.environ["HF_MODULES_CACHE"] = str(folder)
    dynamic = sys.modules.get("transformers.dynamic_module_utils")
    if dynamic is not None:
        dynamic.HF_MODULES_CACHE = str(folder)


# ---------------------------------------------------------------------------------------------- weights files

SAFETENSORS_SUFFIX = ".safetensors"
PICKLE_WEIGHTS = (".bin", ".pt", ".pth")  # torch.save files: read with weights_only=True, never unpickled otherwise
T = TypeVar("T")


def weights_problem(error: BaseException) -> Optional[str]:
    """What is wrong with a weights file, from the error its loader raised: a pickle that is more than tensors
    (weights_only refuses it: it would run code), a truncated or damaged safetensors or zip file; None for
    anything else."""
    import pickle
    import zipfile

    name = type(error).__name__
    first = str(error).strip().splitlines()[0][:160] if str(error).strip() else name
    if isinstance(error, pickle.UnpicklingError):
        return "a pickle that holds more than tensors (it would run code), refused by torch.load(weights_only=True)"
    if name == "SafetensorError":
        return f"a damaged or truncated safetensors file ({first})"
    if isinstance(error, (EOFError, zipfile.BadZipFile)) or (isinstance(error, RuntimeError) and (
            "zip" in first.lower() or "PytorchStreamReader" in first)):
        return f"a damaged or truncated weights file ({first})"
    return None


def check_weight_files(folder: Path, field: str) -> None:
    """A model folder's weights, checked before anything loads them and cheaply (the job admission does it too):
    each .safetensors file's header must cover the file exactly (read, the tensors are not); without safetensors
    (which transformers prefers), each pickle weights file must unpickle with weights_only=True, its tensors
    mapped, not read. UserError naming the file and what is wrong."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    tensors = [p for p in files if p.suffix == SAFETENSORS_SUFFIX]
    for path in tensors or [p for p in files if p.suffix in PICKLE_WEIGHTS]:
        try:
            if path.suffix == SAFETENSORS_SUFFIX:
                from safetensors import safe_open

                with safe_open(str(path), framework="pt") as f:
                    f.keys()
            else:
                import warnings

                import torch

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001 - unpickling, zip and safetensors errors share no narrower base
            problem = weights_problem(e) or f"not a readable weights file ({type(e).__name__})"
            raise UserError(f"{field}: {path} is {problem}; replace it with the model's safetensors weights",
                            public=True) from None


def load_weights_safely(load: Callable[[], T], source: str, field: str) -> T:
    """`load()` of a model's weights; a weights file that is a pickle of code, truncated or damaged is one line
    naming `source` and what is wrong (the loaders raise half a dozen types, each with a long message)."""
    try:
        return load()
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a weights file's fault
        problem = weights_problem(e)
        if problem is None:
            raise
        raise UserError(f"{field}: {source}'s weights are {problem}; replace them with the model's safetensors "
                        "weights", public=True) from None


_warned: set[str] = set()


def warn_remote_code(source: str, local: Path) -> None:
    """The opt-in's one warning per process and source: which files will run."""
    if source in _warned:
        return
    _warned.add(source)
    files = remote_code_files(local) if local.is_dir() else []
    what = ", ".join(str(local / f) for f in files) if files else "whatever code the model names"
    sys.stderr.write(f"warning: {REMOTE_CODE_OPT_IN}: {source} may run its own code: {what}\n")


def from_hub(loader: Callable[..., Any], source: str, what: str, *, field: str, trust_remote_code: bool = False,
             **kwargs: Any) -> Any:
    """`loader(source)` from a local directory or the cache first, the hub only when allowed and needed; its own
    code runs only with `trust_remote_code` (always passed to the loader, so transformers never asks)."""
    local = local_path(source, field) if Path(source).expanduser().is_dir() else Path(source)
    kwargs["trust_remote_code"] = trust_remote_code
    if trust_remote_code:
        warn_remote_code(source, local)
    if local.is_dir():  # a folder someone made: whatever its files make the loader raise is one line
        try:
            return loader(str(local), local_files_only=True, **kwargs)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - a hostile or broken file raises JSON, key, pickle, Rust errors ...
            if needs_remote_code(e) or (not trust_remote_code and remote_code_files(local)
                                        and "model_type" in str(e)):
                raise remote_code_refusal(str(local), field, remote_code_files(local)) from None
            if weights_problem(e) is not None:
                raise
            raise UserError(f"{field}: {local} holds no transformers {what} ({type(e).__name__}: "
                            f"{first_line(e)}); write one with save_pretrained",
                            public=f"{field}: {local} holds no transformers {what}") from None
    try:
        return loader(source, local_files_only=True, **kwargs)
    except OSError:
        pass
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - as above, for what the cache holds
        if needs_remote_code(e):
            raise remote_code_refusal(source, field, []) from None
        if weights_problem(e) is not None:
            raise
        raise UserError(f"{field}: the cached {what} of {source!r} cannot be read ({type(e).__name__}: "
                        f"{first_line(e)}); download it again (`hf download {source}`)",
                        public=f"{field}: the cached {what} of {source!r} cannot be read") from None
    why = why_not_hub()
    if why is not None:
        raise UserError(not_found(source, what, why, field), public=True)
    try:
        return loader(source, **kwargs)
    except ValueError as e:
        if needs_remote_code(e):
            raise remote_code_refusal(source, field, []) from None
        raise
    except OSError as e:
        raise UserError(not_found(source, what, first_line(e), field),  # the hub's answer is not for the job API
                        public=not_found(source, what, "the hub's answer is in the server's log", field)) from None


def not_found(source: str, what: str, why: str, field: str) -> str:
    return (f"{field}: {source!r} is neither a local directory nor in the Hugging Face cache, and its {what} could "
            f"not be fetched ({why}); on a machine with network run `hf download {source}` (the cache is "
            f"~/.cache/huggingface, or $HF_HOME) and copy it here, or point {field} at a local directory")


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
