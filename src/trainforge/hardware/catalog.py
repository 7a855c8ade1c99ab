"""The GPU catalog: specs and prices as data, each with its source.

    from trainforge.hardware.catalog import load_catalog

    catalog = load_catalog()                  # built-in data, plus $TRAINFORGE_CATALOG if set
    h100 = catalog.get("H100")                # canonical name or alias, any case -> h100-sxm
    h100.peak_flops_for("bf16")               # 989e12: dense FLOP/s
    catalog.price("h100-sxm")                 # the default Price (cheapest on-demand), or None
    catalog.match_device_name(torch.cuda.get_device_name())   # this machine's GPU, or None

The built-in data is `hardware/data/gpus.yaml` and `prices.yaml`; a user file with the same shape
(`gpus:` and `prices:` lists) updates or extends it. docs/gpus.md has the table and the file format.
"""
from __future__ import annotations

import datetime
import importlib.resources
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainforge.config import read_yaml
from trainforge.errors import UnknownNameError, UserError

ENV_VAR = "TRAINFORGE_CATALOG"
PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp8")
TERMS = ("on-demand", "capacity block", "serverless")
BUILTIN = "built-in"  # Price.origin of the shipped rows; a user file's rows carry its path

# Fields a `verify` list may name: the YAML paths of the figures.
VERIFIABLE_FIELDS = (
    "memory_bytes", "memory_bandwidth_bytes_per_s",
    *(f"peak_flops.{p}" for p in PRECISIONS),
    "cuda_cores", "sm_count", "tdp_watts",
    "interconnect.kind", "interconnect.bandwidth_bytes_per_s", "interconnect.pcie_gen",
)


# ---------------------------------------------------------------- the file format (validated)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _PeakFlops(_Strict):
    """Dense FLOP/s; None where the GPU has no such path, or (when flagged in verify) no known figure."""

    bf16: Optional[float] = Field(None, gt=0)
    fp16: Optional[float] = Field(None, gt=0)
    tf32: Optional[float] = Field(None, gt=0)
    fp32: Optional[float] = Field(None, gt=0)
    fp8: Optional[float] = Field(None, gt=0)


class _Interconnect(_Strict):
    kind: Literal["nvlink", "pcie"]
    bandwidth_bytes_per_s: float = Field(gt=0)  # per GPU, bidirectional, as datasheets quote it
    pcie_gen: Optional[int] = Field(None, ge=1)


class _GpuEntry(_Strict):
    name: str
    aliases: list[str] = Field(default_factory=list)
    memory_bytes: int = Field(gt=0)
    memory_basis: Literal["torch", "datasheet"] = "datasheet"
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    peak_flops: _PeakFlops
    cuda_cores: Optional[int] = Field(None, gt=0)
    sm_count: Optional[int] = Field(None, gt=0)
    tdp_watts: Optional[float] = Field(None, gt=0)
    interconnect: _Interconnect
    source: str = Field(min_length=1)
    verify: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _canonical(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", v):
            suggestion = _key(v)
            raise ValueError(f"a new GPU's name is lowercase letters, digits and dashes, e.g. {suggestion!r}")
        return v

    @field_validator("memory_bytes", mode="before")
    @classmethod
    def _integral_number(cls, v: Any) -> Any:
        # YAML reads `80e9` as a string and `80.0e+9` as a float; both mean a whole number of bytes.
        if isinstance(v, (str, float)) and not isinstance(v, bool):
            try:
                f = float(v)
            except ValueError:
                return v
            if f.is_integer():
                return int(f)
        return v

    @field_validator("verify")
    @classmethod
    def _known_fields(cls, v: list[str]) -> list[str]:
        bad = [f for f in v if f not in VERIFIABLE_FIELDS]
        if bad:
            raise ValueError(f"unknown field {bad[0]!r}; name one of: {', '.join(VERIFIABLE_FIELDS)}")
        return v


class _PriceEntry(_Strict):
    gpu: str = Field(min_length=1)
    usd_per_hour: float = Field(gt=0)
    provider: str = Field(min_length=1)
    terms: Literal["on-demand", "capacity block", "serverless"]
    date: str
    source: str = Field(min_length=1)

    @field_validator("date", mode="before")
    @classmethod
    def _iso_date(cls, v: Any) -> Any:
        if isinstance(v, datetime.date):  # YAML turns an unquoted 2026-05-07 into a date
            return v.isoformat()
        if isinstance(v, int):  # and an unquoted 2024 into an int
            v = str(v)
        if isinstance(v, str) and not re.fullmatch(r"\d{4}(-\d{2}(-\d{2})?)?", v):
            raise ValueError(f"expected an ISO date (YYYY-MM-DD, YYYY-MM or YYYY), got {v!r}")
        return v


class _File(_Strict):
    # gpu entries stay raw here: an entry for an existing GPU may give only the fields it changes.
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    prices: list[dict[str, Any]] = Field(default_factory=list)


# ---------------------------------------------------------------- the public records


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Units are in the names; `verify` lists the fields recalled, not read from a datasheet."""

    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    memory_basis: str  # "torch": total_memory as torch reports it; "datasheet": N GB as N * 10**9
    memory_bandwidth_bytes_per_s: float
    peak_flops: dict[str, Optional[float]]  # dense FLOP/s by precision (keys: PRECISIONS)
    cuda_cores: Optional[int]
    sm_count: Optional[int]
    tdp_watts: Optional[float]
    interconnect_kind: str  # "nvlink" | "pcie"
    interconnect_bytes_per_s: float
    pcie_gen: Optional[int]
    source: str
    verify: tuple[str, ...]

    def peak_flops_for(self, precision: str) -> float:
        """Dense peak FLOP/s for training in `precision` ("bf16", "fp16", "fp32", also "tf32", "fp8").

        fp32 means the plain fp32 rate: trainforge does not enable TF32 tensor cores for fp32
        training (torch's default), so "tf32" is only what you ask for by name.
        Raises UserError where the GPU has no figure for it (e.g. bf16 on a T4).
        """
        if precision not in PRECISIONS:
            raise UserError(f"precision: unknown {precision!r}; choose one of: {', '.join(PRECISIONS)}")
        flops = self.peak_flops.get(precision)
        if flops is None:
            usable = ", ".join(p for p in PRECISIONS if self.peak_flops.get(p) is not None)
            if f"peak_flops.{precision}" in self.verify:  # flagged null: a gap in our data, not in the GPU
                why = f"no {precision} figure known (set peak_flops.{precision} in a catalog file, see docs/gpus.md)"
            else:
                why = "not supported by this GPU"
            raise UserError(f"precision {precision!r} on {self.name}: {why}; use one of: {usable}")
        return flops


@dataclass(frozen=True)
class Price:
    gpu: str  # canonical catalog name
    usd_per_hour: float  # per GPU
    provider: str
    terms: str  # one of TERMS
    date: str  # ISO: YYYY-MM-DD, YYYY-MM or YYYY, as precise as the source
    source: str
    origin: str = BUILTIN  # "built-in", or the path of the user file it came from


def default_price(rows: list[Price]) -> Optional[Price]:
    """The cheapest on-demand row; if there is none, the cheapest row of any terms; None for no rows.

    User rows (origin not built-in) are considered alone when there are any: a user's own rate
    for a GPU beats every published one.
    """
    user = [p for p in rows if p.origin != BUILTIN]
    pool = user or rows
    on_demand = [p for p in pool if p.terms == "on-demand"]
    candidates = on_demand or pool
    return min(candidates, key=lambda p: p.usd_per_hour) if candidates else None


def _key(text: str) -> str:
    """Lookup key: case, spaces, underscores and dashes do not matter ("H100 SXM" == "h100-sxm")."""
    return re.sub(r"[\s_\-]+", "-", text.strip().lower()).strip("-")


# Vendor words torch puts before the model name ("NVIDIA GeForce RTX 4090", "Tesla T4").
_VENDOR_PREFIX = re.compile(r"^(nvidia-)?(tesla-|geforce-)?")


class Catalog:
    """The GPUs (by canonical name) and their prices. Build it with `load_catalog()`."""

    def __init__(self, gpus: dict[str, GPUSpec], prices: list[Price]) -> None:
        self.gpus = gpus
        self.prices = prices
        self._index: dict[str, str] = {}
        for spec in gpus.values():
            for label in (spec.name, *spec.aliases):
                other = self._index.setdefault(_key(label), spec.name)
                assert other == spec.name, f"{label!r} names both {other} and {spec.name}"

    def names(self) -> list[str]:
        return list(self.gpus)

    def get(self, name_or_alias: str) -> GPUSpec:
        """A GPU by canonical name or alias, ignoring case; UserError listing the names otherwise."""
        name = self._index.get(_key(name_or_alias))
        if name is None:
            raise UnknownNameError(
                f"gpu: unknown GPU {name_or_alias!r}; choose one of: {', '.join(self.names())}"
                f" (aliases such as 'H100' also work; add your own GPU with a catalog file, see docs/gpus.md)"
            )
        return self.gpus[name]

    def price(self, gpu: str, provider: Optional[str] = None) -> Optional[Price]:
        """The default price of `gpu` (see `default_price`), or its price at `provider` (any case); None if none."""
        name = self.get(gpu).name
        rows = [p for p in self.prices if p.gpu == name]
        if provider is not None:
            rows = [p for p in rows if p.provider.lower() == provider.strip().lower()]
        return default_price(rows)

    def match_device_name(self, torch_name: str) -> Optional[GPUSpec]:
        """The entry for a name from `torch.cuda.get_device_name()`, e.g. "NVIDIA H100 80GB HBM3" -> h100-sxm.

        None for a GPU the catalog does not have (e.g. "NVIDIA A100 80GB PCIe"): a near match
        would carry the wrong bandwidth or power, so there is no fuzzy matching.
        """
        key = _key(torch_name)
        name = self._index.get(key) or self._index.get(_VENDOR_PREFIX.sub("", key))
        return self.gpus[name] if name else None


# ---------------------------------------------------------------- loading


def load_catalog(path: Union[str, Path, None] = None) -> Catalog:
    """The built-in catalog, updated by the file at `path`, else by the file named in $TRAINFORGE_CATALOG.

    The file is YAML with optional `gpus:` and `prices:` lists. A gpu entry whose `name` is an
    existing name or alias updates the fields it gives; a new name adds a GPU (all required fields).
    Prices are added (a row with the same gpu, provider and terms replaces the built-in one), and a
    GPU's user rows take precedence for its default price. Any mistake raises a one-line UserError
    naming the file and the field.
    """
    data_dir = importlib.resources.files("trainforge.hardware") / "data"
    entries: dict[str, _GpuEntry] = {}
    prices: list[Price] = []
    for name in ("gpus.yaml", "prices.yaml"):
        # Built-in files go through the same checks as a user's, so a bad edit fails loudly in tests.
        built_in = Path(str(data_dir / name))
        entries, prices = _apply_file(entries, prices, built_in, BUILTIN)
    if path is None and os.environ.get(ENV_VAR):
        path = os.environ[ENV_VAR]
        if not Path(path).is_file():
            raise UserError(f"{ENV_VAR}={path}: no such file; point it at a catalog YAML file or unset it")
    if path is not None:
        entries, prices = _apply_file(entries, prices, Path(path), str(path))
    return Catalog({n: _spec(e) for n, e in entries.items()}, prices)


def _apply_file(
    entries: dict[str, _GpuEntry], prices: list[Price], path: Path, origin: str
) -> tuple[dict[str, _GpuEntry], list[Price]]:
    raw = _read_yaml(path)
    doc = _validate(_File, raw, path, "")
    entries = dict(entries)
    for i, item in enumerate(doc.gpus):
        entry = _gpu_entry(entries, item, path, f"gpus[{i}]")
        entries[entry.name] = entry
        _check_aliases(entries, entry, path, f"gpus[{i}]")
    index = {_key(label): e.name for e in entries.values() for label in (e.name, *e.aliases)}
    prices = list(prices)
    for i, item in enumerate(doc.prices):
        row = _validate(_PriceEntry, item, path, f"prices[{i}]")
        gpu = index.get(_key(row.gpu))
        if gpu is None:
            raise UserError(
                f"{path}: prices[{i}].gpu: unknown GPU {row.gpu!r}; use one of: {', '.join(entries)}"
                f" (or add it under gpus:)"
            )
        price = Price(gpu, row.usd_per_hour, row.provider, row.terms, row.date, row.source, origin)
        same = (gpu, row.provider.lower(), row.terms)
        prices = [p for p in prices if (p.gpu, p.provider.lower(), p.terms) != same] + [price]
    return entries, prices


def _gpu_entry(entries: dict[str, _GpuEntry], item: dict[str, Any], path: Path, where: str) -> _GpuEntry:
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise UserError(
            f"{path}: {where}.name: missing; give an existing GPU's name or alias to update it, or a new name to add one"
        )
    existing = next((e for e in entries.values() if _key(name) in {_key(x) for x in (e.name, *e.aliases)}), None)
    if existing is None:
        return _validate(_GpuEntry, item, path, f"{where} ({name})")
    changed = _leaf_fields({k: v for k, v in item.items() if k not in ("name", "aliases", "source", "verify")})
    merged = _deep_merge(existing.model_dump(), {**item, "name": existing.name})
    if "verify" not in item:  # a figure the user supplied is theirs, not one we recalled
        merged["verify"] = [f for f in existing.verify if f not in changed]
    if "source" not in item and changed:
        merged["source"] = f"{existing.source}; {', '.join(changed)} from {path}"
    if "aliases" in item and isinstance(item["aliases"], list):
        merged["aliases"] = list(dict.fromkeys([*existing.aliases, *item["aliases"]]))
    return _validate(_GpuEntry, merged, path, f"{where} ({existing.name})")


def _check_aliases(entries: dict[str, _GpuEntry], entry: _GpuEntry, path: Path, where: str) -> None:
    for label in (entry.name, *entry.aliases):
        for other in entries.values():
            if other.name != entry.name and _key(label) in {_key(x) for x in (other.name, *other.aliases)}:
                field = "name" if label == entry.name else "aliases"
                raise UserError(
                    f"{path}: {where}.{field}: {label!r} already names {other.name}; "
                    f"use another name, or update {other.name} by giving its name"
                )


def _leaf_fields(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in tree.items():
        if isinstance(v, dict):
            out += _leaf_fields(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _spec(e: _GpuEntry) -> GPUSpec:
    return GPUSpec(
        name=e.name,
        aliases=tuple(e.aliases),
        memory_bytes=e.memory_bytes,
        memory_basis=e.memory_basis,
        memory_bandwidth_bytes_per_s=e.memory_bandwidth_bytes_per_s,
        peak_flops={p: getattr(e.peak_flops, p) for p in PRECISIONS},
        cuda_cores=e.cuda_cores,
        sm_count=e.sm_count,
        tdp_watts=e.tdp_watts,
        interconnect_kind=e.interconnect.kind,
        interconnect_bytes_per_s=e.interconnect.bandwidth_bytes_per_s,
        pcie_gen=e.interconnect.pcie_gen,
        source=e.source,
        verify=tuple(e.verify),
    )


def _read_yaml(path: Path) -> Any:
    return read_yaml(path, expected="a GPU catalog file is a YAML mapping with optional 'gpus:' and 'prices:' lists",
                     allow_empty=True)


def _validate(model: type[BaseModel], raw: Any, path: Path, where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise UserError(f"{path}: {_one_line(err, model, where)}") from None


def _one_line(err: ValidationError, model: type[BaseModel], where: str) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    field = ".".join(x for x in (where, loc) if x) or "file"
    if e["type"] == "extra_forbidden":
        parent = _model_at(model, e["loc"][:-1])
        valid = ", ".join(parent.model_fields) if parent else ""
        return f"{field}: unknown key; valid keys here: {valid}"
    if e["type"] == "missing":
        return f"{field}: missing; this field is required"
    msg = e["msg"].removeprefix("Value error, ")
    got = repr(e.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    return f"{field}: {msg[0].lower() + msg[1:]}, got {got}"


def _model_at(model: type[BaseModel], loc: tuple) -> Optional[type[BaseModel]]:
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        nxt = next((c for c in (ann, *getattr(ann, "__args__", ())) if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


# ---------------------------------------------------------------- rows for `trainforge gpus --json`


def catalog_rows(catalog: Catalog) -> list[dict[str, Any]]:
    """One JSON-able dict per GPU: every GPUSpec field plus `price`, its default Price as a dict (or None)."""
    rows = []
    for spec in catalog.gpus.values():
        row = {k: (list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v)
               for k, v in vars(spec).items()}
        price = catalog.price(spec.name)
        row["price"] = vars(price).copy() if price else None
        rows.append(row)
    return rows
