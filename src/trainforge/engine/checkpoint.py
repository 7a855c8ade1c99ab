"""Atomic, verified checkpoints.

Layout of one checkpoint (`checkpoints/step-000120/`):
    model.safetensors   model weights
    state.pt            everything else needed to continue exactly: optimizer, scaler, RNG states,
                        data position, counters, EMA/best weights, config (YAML text), preprocessing
                        (JSON text); only tensors, numbers, strings, lists and dicts, so it loads with
                        torch.load(weights_only=True)
    manifest.json       SHA-256 of each file above, written last inside the directory

A checkpoint is written into a temporary directory, every file fsynced, then renamed into place;
`checkpoints/latest` (the name of the newest complete checkpoint) is rewritten after it through a
temp file and a rename. A SIGKILL at any instant leaves the old or the new checkpoint usable.
"""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trainforge.errors import UserError
from trainforge.files import fsync_dir, write_text_atomic
from trainforge.integrity import MANIFEST_FILE, check_files, read_digests, write_manifest
from trainforge.models.lora import adapter_names
from trainforge.layout import LATEST, STATE, STEP_GLOB, TMP_STEP_GLOB, WEIGHTS, step_dir_name
MODEL_FILE = WEIGHTS
STATE_FILE = STATE
OTHER_CHECKPOINT = "resume from another checkpoint"


def contiguous_state(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared or non-contiguous storage: save detached contiguous CPU copies.

    Tied weights appear once under their first name; `load_model_weights` restores the rest.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple] = set()
    for name, t in state_dict.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride())) if t.numel() else (id(t),)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def save_checkpoint(
    root: Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint `step` under `root` atomically, point `latest` at it, keep the newest `keep`."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(contiguous_state(model_state), str(tmp / MODEL_FILE))
    torch.save(state, tmp / STATE_FILE)
    return publish(tmp, final, step, keep)


def publish(tmp: Path, final: Path, step: int, keep: int) -> Path:
    """Hash and fsync every file of `tmp`, rename it to `final`, then rewrite `latest` and prune."""
    root = final.parent
    write_manifest(tmp, {"step": step})
    if final.exists():  # the same step saved again (e.g. a signal right after a periodic save)
        trash = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, trash)
        shutil.rmtree(trash)
    os.replace(tmp, final)
    fsync_dir(root)
    write_text_atomic(root / LATEST, final.name + "\n")
    prune_checkpoints(root, keep)
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories that were renamed into place, oldest first (temp dirs excluded)."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob(STEP_GLOB) if p.is_dir() and (p / MANIFEST_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def prune_checkpoints(root: Path, keep: int) -> None:
    latest = read_latest(root)
    ckpts = complete_checkpoints(root)
    for old in ckpts[:-keep] if keep > 0 else []:
        if latest is not None and old.name == latest.name:
            continue
        shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(TMP_STEP_GLOB):  # left by a kill mid-write; never referenced by `latest`
        if not tmp.name.endswith("-sharded"):  # the sharded one in flight is cleaned by its writer
            shutil.rmtree(tmp, ignore_errors=True)


def read_latest(root: Path) -> Optional[Path]:
    try:
        name = (root / LATEST).read_text().strip()
    except OSError:
        return None
    path = root / name
    return path if name and path.is_dir() else None


def verify_checkpoint(path: Path) -> None:
    """Raise UserError unless every file matches the SHA-256 recorded in the manifest."""
    digests = read_digests(path, unverifiable=f"{path.name} is not a complete checkpoint: {OTHER_CHECKPOINT}")
    check_files(path, digests, digests, fix=OTHER_CHECKPOINT, unverifiable=OTHER_CHECKPOINT)


def find_resume_checkpoint(root: Path) -> Optional[Path]:
    """The newest complete checkpoint that verifies: `latest` first, then older ones."""
    candidates = complete_checkpoints(root)
    latest = read_latest(root)
    if latest is not None and latest in candidates:
        candidates.remove(latest)
        candidates.append(latest)
    for path in reversed(candidates):
        try:
            verify_checkpoint(path)
            return path
        except UserError as e:
            warnings.warn(f"skipping checkpoint {path.name}: {e}")
    return None


def load_checkpoint(path: Path, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model weights, state) of a checkpoint, verified unless `verify` is False, loaded with weights_only=True."""
    if verify:
        verify_checkpoint(path)
    return load_weights(path / MODEL_FILE), read_state(path / STATE_FILE)


def load_weights(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a truncated or damaged one is a UserError naming it."""
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{file}: not a readable safetensors file ({reason}); restore it or use another checkpoint") from None


def read_state(file: Path) -> dict[str, Any]:
    """state.pt through torch.load(weights_only=True): anything but tensors, numbers, strings, lists and dicts
    (a pickled object, i.e. code to run) is refused, and so is a damaged file, as a UserError naming it."""
    with warnings.catch_warnings():  # a foreign pickle's protocol warning would add lines to the one-line error
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception:  # UnpicklingError, RuntimeError (damaged zip), EOFError, OSError ... share no narrower base
            state = None
    if not isinstance(state, dict):
        raise UserError(
            f"{file}: not a trainforge checkpoint state (torch.load with weights_only=True refuses it or it holds no "
            f"dict; a pickled object is never run); {OTHER_CHECKPOINT}"
        )
    return state


def kept_weights(model: torch.nn.Module, state_dict: dict[str, Any]) -> dict[str, Any]:
    """What checkpoints, best weights and final/ keep of `model`'s state: all of it, or for a model with LoRA
    adapters on a frozen base only the trainable part (the base is rebuilt from its source and checked)."""
    names = adapter_names(model)
    return state_dict if names is None else {k: v for k, v in state_dict.items() if k in names}


def load_model_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load weights saved by `contiguous_state` (tied duplicates absent) strictly otherwise; a model with
    adapters on a frozen base takes its trainable weights only (`kept_weights`)."""
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shapes differ: weights of another model, or a model.json edited after training
        raise UserError(f"checkpoint does not match the model: {str(e).strip().splitlines()[-1].strip()}") from None
    if unexpected:
        raise UserError(f"checkpoint does not match the model: unexpected weights {unexpected[:3]}")
    own = model.state_dict()
    ptr_of = {}
    for name, t in own.items():
        ptr_of.setdefault(t.data_ptr(), name)
    adapters = adapter_names(model)
    really_missing = [m for m in missing if ptr_of.get(own[m].data_ptr()) == m and (adapters is None or m in adapters)]
    if really_missing:
        raise UserError(f"checkpoint does not match the model: missing weights {really_missing[:3]}")


# ---------------------------------------------------------------- sharded (FSDP) checkpoints

DCP_METADATA = ".metadata"  # written by torch.distributed.checkpoint next to its shard files


def is_sharded(path: Path) -> bool:
    return (path / DCP_METADATA).is_file()


def save_sharded_checkpoint(
    root: Path, step: int, tensors: dict[str, Any], state: dict[str, Any], keep: int, *, is_main: bool, barrier
) -> Path:
    """All ranks: write `tensors` (model and optimizer shards) with torch.distributed.checkpoint into a
    temp directory; rank 0 then adds state.pt and the manifest, renames it into place and rewrites
    `latest`, exactly like `save_checkpoint`. `barrier` synchronizes the ranks."""
    import torch.distributed.checkpoint as dcp  # heavy (torch.distributed.checkpoint): only sharded runs load it

    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-sharded"
    if is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier()
    dcp.save(tensors, checkpoint_id=str(tmp))
    barrier()
    if is_main:
        torch.save(state, tmp / STATE_FILE)
        publish(tmp, final, step, keep)
    barrier()
    return final


def load_sharded_into(path: Path, tensors: dict[str, Any]) -> None:
    """Fill `tensors` (sharded or whole, any world size) in place from a sharded checkpoint."""
    import torch.distributed as dist  # with dcp: only sharded runs need it
    import torch.distributed.checkpoint as dcp  # heavy (torch.distributed.checkpoint): only sharded runs load it

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, checkpoint_id=str(path), no_dist=not dist.is_initialized())


def load_state(path: Path, verify: bool = True) -> dict[str, Any]:
    if verify:
        verify_checkpoint(path)
    return read_state(path / STATE_FILE)
