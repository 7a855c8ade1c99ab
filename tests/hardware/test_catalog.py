"""GPU catalog: the corrected facts, dense-not-sparse figures, lookups, prices and user override files."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainforge.errors import UserError
from trainforge.hardware.catalog import (
    BUILTIN,
    ENV_VAR,
    PRECISIONS,
    TERMS,
    Price,
    catalog_rows,
    default_price,
    load_catalog,
)

REPO = Path(__file__).resolve().parents[2]
REFERENCE_GPUS = [  # the rows of the reference spec table, by canonical name
    "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "l4", "t4",
    "v100-32gb", "rtx-4090", "rtx-3090", "rtx-5090",
]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(autouse=True)
def _no_user_catalog(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_catalog_has_exactly_the_reference_gpus(catalog):
    assert catalog.names() == REFERENCE_GPUS


def test_corrected_facts(catalog):
    """The figures blogs get wrong: cores, memory bandwidth vs NVLink bandwidth, dense bf16."""
    assert catalog.get("a100-40gb").cuda_cores == 6912
    assert catalog.get("a100-80gb").cuda_cores == 6912
    h100 = catalog.get("h100-sxm")
    assert h100.cuda_cores == 16896
    assert h100.sm_count == 132
    assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert (h100.interconnect_kind, h100.interconnect_bytes_per_s) == ("nvlink", pytest.approx(900e9))
    assert h100.peak_flops_for("bf16") == pytest.approx(989e12)
    assert h100.peak_flops_for("fp32") == pytest.approx(67e12)
    assert catalog.get("h200").memory_bytes == 141 * 10**9
    assert catalog.get("h200").memory_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert catalog.get("a100-80gb").memory_bandwidth_bytes_per_s == pytest.approx(2039e9)


def test_h100_memory_is_what_torch_reports(catalog):
    h100 = catalog.get("h100-sxm")
    assert (h100.memory_bytes, h100.memory_basis) == (85_029_158_912, "torch")
    # Every other entry is the datasheet's N GB as N * 10**9, which is below the real capacity.
    assert catalog.get("a100-80gb").memory_bytes == 80 * 10**9
    assert {g.memory_basis for g in catalog.gpus.values() if g.name != "h100-sxm"} == {"datasheet"}


def test_flops_are_dense_not_sparse(catalog):
    # Datasheets quote Hopper/Blackwell with sparsity (H100: 1979 TF bf16); dense is half.
    for name in ("h100-sxm", "h200"):
        assert catalog.get(name).peak_flops["bf16"] < 1.5e15
        assert catalog.get(name).peak_flops["fp8"] < 3e15
        assert catalog.get(name).peak_flops["tf32"] == pytest.approx(494.5e12)
    assert catalog.get("a100-40gb").peak_flops["bf16"] == pytest.approx(312e12)
    assert catalog.get("a100-40gb").peak_flops["tf32"] == pytest.approx(156e12)
    assert catalog.get("b200").peak_flops["bf16"] == pytest.approx(2250e12)
    assert catalog.get("rtx-4090").peak_flops["fp16"] == pytest.approx(165e12)  # fp32 accumulate, not 330


@pytest.mark.parametrize("name", REFERENCE_GPUS)
def test_precision_figures_are_consistent(catalog, name):
    """fp32 <= tf32 < bf16 == fp16, fp8 = 2x bf16: a sparse figure mixed in would break the ratios."""
    f = catalog.get(name).peak_flops
    assert set(f) == set(PRECISIONS)
    assert f["fp32"] is not None and f["fp16"] is not None
    if f["bf16"] is not None:
        assert f["bf16"] == f["fp16"]
    if f["tf32"] is not None:
        assert f["fp32"] <= f["tf32"] < f["fp16"]
        assert f["tf32"] == pytest.approx(f["fp16"] / 2, rel=0.05)  # a 2x (sparse) slip fails
    if f["fp8"] is not None:
        assert f["fp8"] == pytest.approx(2 * f["fp16"], rel=0.02)
    assert max(v for v in f.values() if v is not None) <= 4.5e15


def test_unsupported_precision_is_a_user_error(catalog):
    with pytest.raises(UserError, match=r"'bf16' on t4: not supported by this GPU; use one of: fp16, fp32"):
        catalog.get("t4").peak_flops_for("bf16")
    with pytest.raises(UserError, match="'bf16' on v100-32gb: not supported"):
        catalog.get("V100").peak_flops_for("bf16")
    with pytest.raises(UserError, match="'fp8' on rtx-5090: no fp8 figure known"):
        catalog.get("rtx-5090").peak_flops_for("fp8")  # a gap in the data, flagged, not a missing feature
    with pytest.raises(UserError, match="precision: unknown 'int4'"):
        catalog.get("h100").peak_flops_for("int4")


@pytest.mark.parametrize("label", ["h100", "H100", "H100 SXM5 80GB", "nvidia h100 80gb hbm3", "H100_SXM", "h100-sxm"])
def test_alias_lookup_ignores_case_and_separators(catalog, label):
    assert catalog.get(label).name == "h100-sxm"


def test_unknown_gpu_lists_valid_names(catalog):
    with pytest.raises(UserError) as info:
        catalog.get("a100")  # ambiguous (40 or 80 GB), so deliberately not an alias
    message = str(info.value)
    assert message.startswith("gpu: unknown GPU 'a100'; choose one of: ")
    assert all(name in message for name in REFERENCE_GPUS)
    assert "\n" not in message


@pytest.mark.parametrize("torch_name, expected", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("NVIDIA A100 80GB PCIe", None),  # a different part (bandwidth, power): no near match
    ("NVIDIA H100 NVL", None),
    ("Intel(R) Data Center GPU Max 1550", None),
])
def test_match_device_name(catalog, torch_name, expected):
    spec = catalog.match_device_name(torch_name)
    assert (spec.name if spec else None) == expected


def test_reference_verify_marks_are_kept_as_flags(catalog):
    pcie = catalog.get("h100-pcie")
    assert pcie.peak_flops_for("bf16") == pytest.approx(756e12)  # the figure is kept ...
    assert {"peak_flops.bf16", "peak_flops.fp32", "peak_flops.fp8", "interconnect.bandwidth_bytes_per_s"} <= set(pcie.verify)
    for name in ("v100-32gb", "rtx-3090", "rtx-5090"):  # rows whose source itself is marked [verify]
        assert {"memory_bandwidth_bytes_per_s", "peak_flops.fp16", "peak_flops.fp32", "cuda_cores"} <= set(catalog.get(name).verify)
    assert "peak_flops.bf16" not in catalog.get("h100-sxm").verify


def test_every_gpu_has_a_source_and_every_price_its_provenance(catalog):
    for spec in catalog.gpus.values():
        assert spec.source.strip(), spec.name
    assert len(catalog.prices) == 20  # the reference's rows less Lambda's A10, which is not in the catalog
    for p in catalog.prices:
        assert p.provider and p.source and p.terms in TERMS and p.usd_per_hour > 0
        assert re.fullmatch(r"\d{4}(-\d{2}(-\d{2})?)?", p.date), p
        assert p.gpu in catalog.gpus and p.origin == BUILTIN


def test_gpus_without_any_price_are_exactly_the_known_gaps(catalog):
    """The reference has no V100 price; every other GPU has at least one."""
    assert [n for n in catalog.names() if catalog.price(n) is None] == ["v100-32gb"]


def test_default_price_is_the_cheapest_on_demand_row(catalog):
    h100 = catalog.price("H100")  # Lambda 3.78 of RunPod 4.76 (on demand), Modal 3.95, AWS 4.92
    assert (h100.provider, h100.usd_per_hour, h100.terms) == ("Lambda", 3.78, "on-demand")
    assert catalog.price("a100-80gb").provider == "RunPod"
    t4 = catalog.price("t4")  # no on-demand row: the cheapest of any terms
    assert (t4.provider, t4.terms) == ("Modal", "serverless")
    assert catalog.price("h100-sxm", provider="aws").usd_per_hour == 4.92
    assert catalog.price("h100-sxm", provider="nobody") is None


def test_default_price_rule_prefers_user_rows():
    row = lambda usd, terms="on-demand", origin=BUILTIN: Price("x", usd, "p", terms, "2026", "s", origin)
    assert default_price([]) is None
    # On demand first, even when a serverless or capacity-block row is cheaper.
    assert default_price([row(2.0), row(1.0, "serverless"), row(0.5, "capacity block"), row(3.0)]).usd_per_hour == 2.0
    assert default_price([row(1.0), row(5.0, "capacity block", origin="mine.yaml")]).usd_per_hour == 5.0


def test_catalog_rows_are_json_with_default_price(catalog):
    rows = json.loads(json.dumps(catalog_rows(catalog)))
    assert [r["name"] for r in rows] == REFERENCE_GPUS
    h100 = rows[REFERENCE_GPUS.index("h100-sxm")]
    assert h100["peak_flops"]["bf16"] == 989e12 and h100["memory_basis"] == "torch"
    assert h100["price"]["usd_per_hour"] == 3.78 and h100["price"]["date"] == "2026-05-07"
    assert rows[REFERENCE_GPUS.index("v100-32gb")]["price"] is None


# ---------------------------------------------------------------- user override files

OVERRIDE = """
gpus:
  - name: my-gpu
    aliases: ["Acme X1", "ACME X1 48GB"]
    memory_bytes: 48e9
    memory_bandwidth_bytes_per_s: 1.2e12
    peak_flops: {bf16: 400e12, fp16: 400e12, fp32: 50e12}
    tdp_watts: 400
    interconnect: {kind: pcie, bandwidth_bytes_per_s: 64e9, pcie_gen: 4}
    source: Acme datasheet rev 3
  - name: H100 PCIe           # an alias of an existing GPU: update only what is given
    memory_bytes: 85_000_000_000
    peak_flops: {bf16: 750e12}
prices:
  - {gpu: h100-sxm, usd_per_hour: 2.10, provider: MyCloud, terms: capacity block, date: 2026-06-01, source: our contract}
  - {gpu: Acme X1, usd_per_hour: 1.00, provider: Acme, terms: on-demand, date: 2026-06, source: quote}
  - {gpu: l4, usd_per_hour: 0.70, provider: RunPod, terms: on-demand, date: 2026-07, source: runpod.io}
"""


@pytest.fixture()
def override_file(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(OVERRIDE)
    return path


def _check_override(cat, path):
    mine = cat.get("acme x1")
    assert mine.name == "my-gpu" and mine.memory_bytes == 48 * 10**9
    assert mine.peak_flops_for("bf16") == 400e12 and mine.peak_flops["tf32"] is None
    assert cat.price("my-gpu").usd_per_hour == 1.00
    # A user price takes precedence for its GPU even though it is dearer than, and not on demand like, Lambda's.
    price = cat.price("h100-sxm")
    assert (price.provider, price.usd_per_hour, price.date, price.origin) == ("MyCloud", 2.10, "2026-06-01", str(path))
    assert cat.price("h100-sxm", provider="Lambda").usd_per_hour == 3.78  # built-in rows stay listed
    # Same gpu, provider and terms: the user's row replaces the built-in one.
    assert [p.usd_per_hour for p in cat.prices if p.gpu == "l4" and p.provider == "RunPod"] == [0.70]
    # A partial update keeps the other fields and un-flags the figures the user supplied.
    pcie = cat.get("h100-pcie")
    assert pcie.memory_bytes == 85 * 10**9 and pcie.peak_flops["bf16"] == 750e12
    assert pcie.peak_flops["fp32"] == 51e12 and pcie.cuda_cores == 14592
    assert "peak_flops.bf16" not in pcie.verify and "peak_flops.fp32" in pcie.verify
    assert str(path) in pcie.source and "peak_flops.bf16" in pcie.source
    assert len(cat.gpus) == len(REFERENCE_GPUS) + 1


def test_override_file_adds_a_gpu_and_replaces_prices(override_file, catalog):
    _check_override(load_catalog(override_file), override_file)
    assert catalog.price("h100-sxm").provider == "Lambda"  # the built-in catalog is untouched


def test_env_var_names_the_override_file(override_file, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(override_file))
    _check_override(load_catalog(), override_file)


def test_env_var_pointing_nowhere_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match=f"{ENV_VAR}=.*missing.yaml: no such file"):
        load_catalog()


BAD_FILES = [
    ("gpus: [\n  - name: x\n  bad", r"malformed YAML"),
    ("- just\n- a list\n", r"a GPU catalog file is a YAML mapping"),
    ("gpu: []\n", r"gpu: unknown key; valid keys here: gpus, prices"),
    ("gpus:\n  - name: h100\n    memory_bytes: lots\n", r"gpus\[0\] \(h100-sxm\)\.memory_bytes: .*got 'lots'"),
    ("gpus:\n  - name: h100\n    peak_flops: {bf17: 1.0e+15}\n",
     r"gpus\[0\] \(h100-sxm\)\.peak_flops\.bf17: unknown key; valid keys here: bf16, fp16, tf32, fp32, fp8"),
    ("gpus:\n  - name: h100\n    verify: [speed]\n", r"gpus\[0\] \(h100-sxm\)\.verify: unknown field 'speed'"),
    ("gpus:\n  - name: new-gpu\n    source: x\n", r"gpus\[0\] \(new-gpu\)\.memory_bytes: missing"),
    ("gpus:\n  - name: New GPU\n", r"gpus\[0\] \(New GPU\)\.name: a new GPU's name is lowercase letters, digits and dashes, e.g. 'new-gpu'"),
    ("gpus:\n  - memory_bytes: 1\n", r"gpus\[0\]\.name: missing"),
    ("prices:\n  - {gpu: h100, usd_per_hour: -1, provider: a, terms: on-demand, date: 2026, source: s}\n",
     r"prices\[0\]\.usd_per_hour: input should be greater than 0"),
    ("prices:\n  - {gpu: h100, usd_per_hour: 1, provider: a, terms: spot, date: 2026, source: s}\n",
     r"prices\[0\]\.terms: input should be 'on-demand', 'capacity block' or 'serverless'"),
    ("prices:\n  - {gpu: h100, usd_per_hour: 1, provider: a, terms: on-demand, date: last week, source: s}\n",
     r"prices\[0\]\.date: expected an ISO date"),
    ("prices:\n  - {gpu: a100, usd_per_hour: 1, provider: a, terms: on-demand, date: 2026, source: s}\n",
     r"prices\[0\]\.gpu: unknown GPU 'a100'; use one of: a100-40gb"),
]


@pytest.mark.parametrize("text, message", BAD_FILES)
def test_bad_override_file_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_catalog(path)
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(f"{path}:")
    assert re.search(message, line), line


def test_new_gpu_may_not_take_an_existing_alias(tmp_path):
    path = tmp_path / "clash.yaml"
    path.write_text(OVERRIDE.replace('aliases: ["Acme X1", "ACME X1 48GB"]', 'aliases: ["Acme X1", "RTX 4090"]'))
    with pytest.raises(UserError, match=r"gpus\[0\]\.aliases: 'RTX 4090' already names rtx-4090"):
        load_catalog(path)


def test_missing_override_file_names_it(tmp_path):
    with pytest.raises(UserError, match=r"nope\.yaml: cannot read \(No such file or directory\); check the path"):
        load_catalog(tmp_path / "nope.yaml")


def test_docs_table_lists_every_gpu_with_its_default_price(catalog):
    doc = (REPO / "docs" / "gpus.md").read_text()
    for name in catalog.names():
        assert f"| `{name}` |" in doc, name
        price = catalog.price(name)
        if price is not None:
            assert f"{price.usd_per_hour:.2f} {price.provider}" in doc, name


def test_docs_override_example_loads(tmp_path):
    doc = (REPO / "docs" / "gpus.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", doc, re.S).group(1)
    path = tmp_path / "example.yaml"
    path.write_text(example)
    cat = load_catalog(path)
    assert cat.get("Acme X1").name == "acme-x1" and cat.price("acme-x1").usd_per_hour == 1.00
    pcie = cat.get("h100-pcie")
    assert (pcie.interconnect_kind, pcie.interconnect_bytes_per_s, pcie.pcie_gen) == ("pcie", 128e9, 5)
    assert pcie.memory_basis == "torch"


def test_the_pages_that_code_and_docs_cite_are_in_the_repository():
    """Every docs/NAME.md that the code, the catalog data, the docs or the README cite exists (issue 39: the GPU facts
    were cited from a page outside the repository), and the catalog's own facts page backs its figures."""
    root = Path(__file__).resolve().parents[2]
    files = [*sorted((root / "src").rglob("*.py")), *sorted((root / "src").rglob("*.yaml")),
             *sorted((root / "docs").glob("*.md")), root / "README.md"]
    cited = {m for f in files for m in re.findall(r"docs/[\w.-]+\.md", f.read_text(encoding="utf-8"))}
    assert "docs/gpu-facts.md" in cited
    assert sorted(c for c in cited if not (root / c).is_file()) == []
    outside = [str(f.relative_to(root)) for f in files if re.search(r"reference/gpu-facts|shared/reference",
                                                                       f.read_text(encoding="utf-8"))]
    assert outside == []
    facts = (root / "docs" / "gpu-facts.md").read_text(encoding="utf-8")
    catalog = load_catalog()
    cores = {name: catalog.get(name).cuda_cores for name in catalog.names()}
    assert {n: c for n, c in cores.items() if c and str(c) not in facts} == {}  # each catalog figure has its row
