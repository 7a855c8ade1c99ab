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

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file

from trainforge.errors import UserError

LATEST = "latest"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
    files = sorted(p.name for p in tmp.iterdir() if p.is_file())
    (tmp / MANIFEST_FILE).write_text(json.dumps({"step": step, "sha256": {n: sha256_file(tmp / n) for n in files}}, indent=1))
    for name in (*files, MANIFEST_FILE):
        _fsync_file(tmp / name)
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (e.g. a signal right after a periodic save)
        trash = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, trash)
        shutil.rmtree(trash)
    os.replace(tmp, final)
    _fsync_dir(root)
    write_text_atomic(root / LATEST, final.name + "\n")
    prune_checkpoints(root, keep)
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories that were renamed into place, oldest first (temp dirs excluded)."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / MANIFEST_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def prune_checkpoints(root: Path, keep: int) -> None:
    latest = read_latest(root)
    ckpts = complete_checkpoints(root)
    for old in ckpts[:-keep] if keep > 0 else []:
        if latest is not None and old.name == latest.name:
            continue
        shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(".tmp-step-*"):  # left by a kill mid-write; never referenced by `latest`
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
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        raise UserError(f"{path}: not a complete checkpoint (no readable {MANIFEST_FILE})") from None
    for name, digest in manifest["sha256"].items():
        file = path / name
        if not file.is_file():
            raise UserError(f"{file}: missing from checkpoint; resume from another checkpoint")
        if sha256_file(file) != digest:
            raise UserError(f"{file}: SHA-256 mismatch (corrupted); resume from another checkpoint")


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


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model weights, state) of a verified checkpoint, loaded with weights_only=True."""
    verify_checkpoint(path)
    model_state = load_file(str(path / MODEL_FILE))
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return model_state, state


def load_model_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load weights saved by `contiguous_state` (tied duplicates absent) strictly otherwise."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise UserError(f"checkpoint does not match the model: unexpected weights {unexpected[:3]}")
    own = model.state_dict()
    ptr_of = {}
    for name, t in own.items():
        ptr_of.setdefault(t.data_ptr(), name)
    really_missing = [m for m in missing if ptr_of.get(own[m].data_ptr()) == m]
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
    import torch.distributed.checkpoint as dcp

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
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, checkpoint_id=str(path), no_dist=not dist.is_initialized())


def load_state(path: Path) -> dict[str, Any]:
    verify_checkpoint(path)
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
