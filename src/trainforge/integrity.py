"""SHA-256 manifests: what a directory of artifacts held when trainforge wrote it.

    names = write_manifest(tmp_dir, {"step": 120})        # last, after every other file
    digests = read_digests(final_dir, unverifiable="pass --no-verify ...")
    check_files(final_dir, digests, ["model.safetensors", "model.json"], fix="...", unverifiable="...")

`manifest.json` is `{..., "sha256": {file name: hex digest}}` over the plain files of its directory.
Checkpoints, final/ and the folder `trainforge compress` writes all carry one. It catches a flipped bit or
a file edited or swapped after the fact; it is not a signature (whoever can rewrite the files can rewrite
the manifest too). Standard library only: `trainforge predict` verifies artifacts where torch is absent.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Optional

from trainforge.errors import UserError
from trainforge.files import fsync_file, write_json_atomic
from trainforge.layout import MANIFEST

MANIFEST_FILE = MANIFEST
HASH_BLOCK_BYTES = 1 << 20
NO_VERIFY = "pass --no-verify to skip the SHA-256 check"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(HASH_BLOCK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, extra: Optional[dict[str, Any]] = None) -> list[str]:
    """Hash and fsync every plain file of `directory`, then write its manifest atomically; the hashed names.

    Call it after the last other file is written: a reader that finds the manifest finds every file it names.
    Subdirectories (a compression's finetune/ run) are not covered: they carry their own manifests.
    """
    names = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    digests = {name: sha256_file(directory / name) for name in names}
    for name in names:
        fsync_file(directory / name)
    write_json_atomic(directory / MANIFEST_FILE, {**(extra or {}), "sha256": digests}, indent=1)
    return names


def read_digests(directory: Path, unverifiable: str) -> dict[str, str]:
    """{file name: SHA-256} from `directory`'s manifest; `unverifiable` ends the error when it is absent or damaged."""
    manifest = directory / MANIFEST_FILE
    try:
        digests = json.loads(manifest.read_text())["sha256"]
    except FileNotFoundError:
        raise UserError(f"{manifest}: missing, so the files beside it cannot be checked; {unverifiable}") from None
    except (OSError, ValueError, KeyError, TypeError):
        digests = None
    if not isinstance(digests, dict) or not all(isinstance(d, str) for d in digests.values()):
        raise UserError(f"{manifest}: unreadable or damaged (no {{\"sha256\": {{file: digest}}}} map); {unverifiable}")
    return digests


def check_files(directory: Path, digests: dict[str, str], names: Iterable[str], *, fix: str, unverifiable: str) -> None:
    """Raise UserError at the first of `names` that is unlisted, missing, or differs from its recorded SHA-256.

    `fix` ends the message for a missing or damaged file, `unverifiable` for one the manifest does not list.
    """
    manifest = directory / MANIFEST_FILE
    for name in names:
        file = directory / name
        if name not in digests:
            raise UserError(f"{file}: not listed in {manifest}, so it cannot be checked; {unverifiable}")
        if not file.is_file():
            raise UserError(f"{file}: missing (listed in {manifest}); {fix}")
        if sha256_file(file) != digests[name]:
            raise UserError(f"{file}: SHA-256 mismatch with {manifest} (corrupted or modified); {fix}")
