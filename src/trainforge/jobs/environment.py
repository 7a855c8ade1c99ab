"""What a job process inherits from the server: an allow-list of its environment, never the whole of it.

    base = inherited_env(os.environ, extra=["WANDB_MODE"])     # PATH, locale, CUDA/NCCL/torch settings, caches ...
    caches = model_caches(os.environ)                          # {"HF_HOME": ..., "TORCH_HOME": ...}: read by jobs
    allowed = parse_tracking_allow(["https://mlflow.corp:5000"])   # `trainforge server --tracking-uri-allow URI`
    uri_allowed("https://mlflow.corp:5000/", allowed)          # True: that server's credentials may go with the job
    tracking_secrets(os.environ)                               # MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN ... if set

The server's environment holds what its operator was given in confidence (MLflow and cloud credentials, tokens of
every kind). A job gets the variables named here (or by `--job-env NAME`), minus anything whose name says it is a
secret, and the tracking credentials only when its log.mlflow.tracking_uri is one the operator allowed: a
submitter who names a tracking server of their own gets no credential of the operator's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import urlsplit

from trainforge.errors import UserError, quote

NAMES = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SSL_CERT_FILE",
         "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
PREFIXES = ("LC_", "CUDA_", "NCCL_", "NVIDIA_", "CUBLAS_", "CUDNN_", "PYTORCH_", "TORCH_", "TORCHINDUCTOR_",
            "TRITON_", "GLOO_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
SECRET_WORDS = ("TOKEN", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "KEY", "AUTH")  # never inherited by name
TRACKING_SECRETS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                    "MLFLOW_TRACKING_CLIENT_CERT_PATH", "MLFLOW_TRACKING_SERVER_CERT_PATH",
                    "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_AWS_SIGV4", "MLFLOW_TRACKING_AUTH")
ALLOW_FLAG = "--tracking-uri-allow"


def is_secret(name: str) -> bool:
    return any(word in name.upper() for word in SECRET_WORDS)


def inherited_env(server_env: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The part of the server's environment a job may see: NAMES, PREFIXES (no secret among them) and `extra`
    (`--job-env NAME`: the operator's explicit choice, secret-sounding or not)."""
    keep = {k: v for k, v in server_env.items()
            if (k in NAMES or k.startswith(PREFIXES)) and not is_secret(k)}
    keep.update({k: server_env[k] for k in extra if k in server_env})
    return keep


def check_env_names(names: Sequence[str]) -> tuple[str, ...]:
    """`--job-env` values: variable names (not NAME=VALUE: a value on the command line is visible in `ps`)."""
    for name in names:
        if not name or "=" in name or not (name[0].isalpha() or name[0] == "_") or \
                not all(c.isalnum() or c == "_" for c in name):
            raise UserError(f"--job-env: {quote(name)} is not a variable name; pass the name of a variable set in "
                            "the server's environment (its value is passed on, never shown)")
    return tuple(names)


def model_caches(server_env: Mapping[str, str]) -> dict[str, str]:
    """Where the server's Hugging Face and torch hub caches are, as variables a job is given (its HOME is its own
    temp folder, so the defaults under ~ would point elsewhere)."""
    home = server_env.get("HOME") or os.path.expanduser("~")
    xdg = server_env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    caches = {"HF_HOME": server_env.get("HF_HOME") or os.path.join(xdg, "huggingface"),
              "TORCH_HOME": server_env.get("TORCH_HOME") or os.path.join(xdg, "torch")}
    if server_env.get("HF_HUB_CACHE"):
        caches["HF_HUB_CACHE"] = server_env["HF_HUB_CACHE"]
    return {k: os.path.realpath(v) for k, v in caches.items()}


def tracking_secrets(server_env: Mapping[str, str]) -> dict[str, str]:
    return {k: server_env[k] for k in TRACKING_SECRETS if k in server_env}


def _parts(uri: str) -> tuple[str, str, int, str]:
    parts = urlsplit(uri)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def parse_tracking_allow(values: Sequence[str]) -> tuple[str, ...]:
    """`--tracking-uri-allow` values: http(s) URIs of tracking servers, without credentials, query or fragment."""
    for value in values:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            parts = None
        if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise UserError(f"{ALLOW_FLAG}: {quote(value)} is not an http(s) URI of a tracking server; e.g. "
                            "https://mlflow.example.com")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise UserError(f"{ALLOW_FLAG}: {quote(value)} carries credentials, a query or a fragment; give the plain "
                            "URI (credentials go in MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN)")
    return tuple(values)


def uri_allowed(uri: str, allowed: Sequence[str]) -> bool:
    """`uri` names one of the `allowed` tracking servers: same scheme, host and port, and a path at or below the
    allowed one. No credentials, query or fragment in it (the host is judged as a URL parser sees it)."""
    try:
        parts = urlsplit(uri)
        if parts.username or parts.password or parts.query or parts.fragment or "\\" in uri:
            return False
        scheme, host, port, path = _parts(uri)
    except ValueError:
        return False
    for entry in allowed:
        a_scheme, a_host, a_port, a_path = _parts(entry)
        if (scheme, host, port) == (a_scheme, a_host, a_port) and (path == a_path or path.startswith(a_path + "/")):
            return True
    return False


def private_cache_env(tmp_dir: Path) -> dict[str, str]:
    """A job's own temp folder as its HOME, TMPDIR and trainforge cache (manifests, token shards): nothing it
    writes there is seen by another job, and nothing another job writes is read by it."""
    return {"HOME": str(tmp_dir), "TMPDIR": str(tmp_dir), "TRAINFORGE_HOME": str(tmp_dir / "trainforge"),
            "XDG_CACHE_HOME": str(tmp_dir / ".cache"), "XDG_CONFIG_HOME": str(tmp_dir / ".config"),
            "MPLCONFIGDIR": str(tmp_dir / ".config" / "matplotlib"),
            # a model's own code (a recipe that opted in, on a server that allows it) is copied here, not into the
            # shared Hugging Face home where the next job would find it
            "HF_MODULES_CACHE": str(tmp_dir / ".cache" / "hf-modules")}
