"""Offline-first loading from the Hugging Face hub: a local directory, else the local cache, else the hub.

    config = from_hub(AutoConfig.from_pretrained, "bert-base-uncased", "config", field="model.args.pretrained")

The hub is asked only when the source is neither a local directory nor cached, never with
`HF_HUB_OFFLINE=1`, and only once one connection to it has succeeded (`hub_reachable`): on a machine without
network the libraries would otherwise retry for most of a minute before saying so. In a job of the server a local directory is checked against its data roots again
(`confine.local_path`). What cannot be found is one line (a UserError) naming the field, the id and how to
fetch it. Used by the `hf` models and by the data stage (the model's tokenizer and image preprocessing).
"""
from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional
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


def from_hub(loader: Callable[..., Any], source: str, what: str, *, field: str, **kwargs: Any) -> Any:
    """`loader(source)` from a local directory or the cache first, the hub only when allowed and needed."""
    local = local_path(source, field) if Path(source).expanduser().is_dir() else Path(source)
    if local.is_dir():
        try:
            return loader(str(local), local_files_only=True, **kwargs)
        except (OSError, ValueError) as e:
            raise UserError(f"{field}: {local} holds no transformers {what} ({first_line(e)}); write one with "
                            "save_pretrained") from None
    try:
        return loader(source, local_files_only=True, **kwargs)
    except OSError:
        pass
    why = why_not_hub()
    if why is not None:
        raise UserError(not_found(source, what, why, field), public=True)
    try:
        return loader(source, **kwargs)
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
