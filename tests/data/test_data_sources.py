"""Every registered source on tiny generated data: shapes, dtypes, info and the registry errors."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from data_helpers import data_cfg, write_png
from trainforge.data import SOURCES, build_data
from trainforge.errors import UnknownNameError, UserError

EXPECTED_SOURCES = {
    "chat", "coco", "csv", "custom", "digits", "hf_datasets", "imagefolder", "jsonl", "kitti", "masks", "multimodal",
    "pointclouds", "synthetic_images", "synthetic_text",
    "textfile", "torchvision", "voc", "volumes", "webdataset", "yolo",
}


def test_registry_lists_every_source():
    assert set(SOURCES.names()) == EXPECTED_SOURCES
    assert SOURCES.config_key == "data.source"


def test_unknown_source_lists_valid_names():
    with pytest.raises(UnknownNameError, match=r"data.source: unknown data source 'nope'.*digits.*synthetic_images"):
        build_data(data_cfg("nope"), seed=0)


def check_bundle(bundle, *, first_key=(0, 0)):
    """Every split yields tensors matching DataInfo; the report is JSON-able and adds up."""
    info = bundle.info
    dtype = getattr(torch, info.input_dtype)
    for split, key in (("train", first_key), ("val", 0), ("test", 0)):
        ds = getattr(bundle, split)
        if len(ds) == 0:
            continue
        x, y = ds[key]
        assert tuple(x.shape) == info.input_shape and x.dtype == dtype, (split, x.shape, x.dtype)
        assert y.dtype == torch.int64
        if info.task == "lm":
            assert y.shape == x.shape and torch.equal(x[1:], y[:-1])
        else:
            assert y.shape == () and 0 <= int(y) < info.num_classes
    report = json.loads(json.dumps(bundle.report))
    assert sum(report["splits"].values()) == report["rows_kept"]
    assert report["rows_read"] == report["rows_kept"] + sum(report["dropped"].values())
    assert report["splits"] == {"train": len(bundle.train), "val": len(bundle.val), "test": len(bundle.test)}
    json.dumps(bundle.preprocess)
    return report


def test_digits():
    bundle = build_data(data_cfg("digits", normalize="none"), seed=0)
    info = bundle.info
    assert (info.task, info.modality, info.input_shape, info.num_classes) == ("classification", "image", (1, 8, 8), 10)
    assert info.class_names == tuple(str(i) for i in range(10))
    report = check_bundle(bundle)
    assert report["rows_read"] == 1797
    x, _ = bundle.val[0]
    assert x.min() >= 0 and x.max() <= 16 and x.max() > 1  # raw 0..16 scale
    assert bundle.preprocess["image_size"] == 8 and bundle.preprocess["channels"] == 1


def test_digits_are_scikit_learns_digits_read_without_importing_it():
    import subprocess

    from sklearn.datasets import load_digits

    from trainforge.data.sources.digits import load_digits_arrays

    images, labels = load_digits_arrays()
    bunch = load_digits()
    assert np.array_equal(images, bunch.images) and np.array_equal(labels, bunch.target)
    # a process that reads them never imports scikit-learn (about 1.2 s of every run's start)
    probe = ("import sys; from trainforge.data.sources.digits import load_digits_arrays; load_digits_arrays(); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_digits_rejects_args():
    with pytest.raises(UserError, match=r"data.args.foo: unknown argument for data source 'digits'"):
        build_data(data_cfg("digits", args={"foo": 1}), seed=0)


def test_synthetic_images_is_lazy_seeded_and_learnable():
    cfg = data_cfg("synthetic_images", args={"num_samples": 300, "image_size": 8, "channels": 3, "num_classes": 3})
    a, b = build_data(cfg, seed=5), build_data(cfg, seed=5)
    check_bundle(a)
    samples = a.val.samples
    assert not hasattr(samples, "x"), "images must be generated per index, not stored"
    assert torch.equal(a.val[3][0], b.val[3][0])
    assert not torch.equal(build_data(cfg, seed=6).val[3][0], a.val[3][0])
    # learnable: nearest class mean (fitted on train) beats chance by far on val
    xs = torch.stack([a.train[(0, i)][0] for i in range(len(a.train))]).flatten(1)
    ys = torch.stack([a.train[(0, i)][1] for i in range(len(a.train))])
    means = torch.stack([xs[ys == c].mean(0) for c in range(3)])
    vx = torch.stack([a.val[i][0] for i in range(len(a.val))]).flatten(1)
    vy = torch.stack([a.val[i][1] for i in range(len(a.val))])
    accuracy = (torch.cdist(vx, means).argmin(1) == vy).float().mean()
    assert accuracy > 0.9


def test_synthetic_images_imagenet_shape_is_cheap():
    cfg = data_cfg("synthetic_images", args={"num_samples": 1_281_167, "image_size": 224, "num_classes": 1000}, normalize="none")
    bundle = build_data(cfg, seed=0)
    assert bundle.info.input_shape == (3, 224, 224) and bundle.info.num_classes == 1000
    assert sum(bundle.report["splits"].values()) == 1_281_167
    x, y = bundle.train[(0, 123_456)]
    assert x.shape == (3, 224, 224) and 0 <= int(y) < 1000


def test_synthetic_text_classification_is_learnable():
    cfg = data_cfg("synthetic_text", args={"num_samples": 400, "seq_len": 32, "vocab_size": 64, "num_classes": 4})
    bundle = build_data(cfg, seed=0)
    info = bundle.info
    assert (info.task, info.modality, info.input_dtype, info.vocab_size, info.seq_len) == (
        "classification", "text", "int64", 64, 32)
    check_bundle(bundle)
    # learnable: class token histograms from train classify val well
    def hist(ds, i, key):
        x, y = ds[key]
        return torch.bincount(x, minlength=64).float(), int(y)
    train = [hist(bundle.train, i, (0, i)) for i in range(len(bundle.train))]
    profile = torch.zeros(4, 64)
    for h, y in train:
        profile[y] += h
    profile = profile / profile.sum(1, keepdim=True)
    val = [hist(bundle.val, i, i) for i in range(len(bundle.val))]
    correct = sum(int((profile.log() @ h).argmax()) == y for h, y in val)
    assert correct / len(val) > 0.9


def test_synthetic_text_lm_follows_a_chain():
    cfg = data_cfg("synthetic_text", args={"task": "lm", "num_samples": 40, "seq_len": 50, "vocab_size": 100})
    bundle = build_data(cfg, seed=0)
    assert bundle.info.task == "lm" and bundle.info.num_classes == 100 and bundle.info.vocab_size == 100
    report = check_bundle(bundle)
    assert report["split_method"] == "contiguous"
    # bigram predictability: the most common successor of each token predicts most next tokens
    pairs = torch.cat([torch.stack(bundle.train[(0, i)], 1) for i in range(len(bundle.train))])
    table = torch.zeros(100, 100)
    table.index_put_((pairs[:, 0], pairs[:, 1]), torch.ones(len(pairs)), accumulate=True)
    assert (table.argmax(1)[pairs[:, 0]] == pairs[:, 1]).float().mean() > 0.8


def test_imagefolder_loads_resized_images(image_tree):
    cfg = data_cfg("imagefolder", path=str(image_tree), args={"image_size": 6})
    bundle = build_data(cfg, seed=0)
    assert bundle.info.class_names == ("cat", "dog", "fox")
    assert bundle.info.input_shape == (3, 6, 6)
    check_bundle(bundle)
    gray = build_data(data_cfg("imagefolder", path=str(image_tree), args={"image_size": 6, "grayscale": True}), seed=0)
    assert gray.info.input_shape == (1, 6, 6) and gray.val[0][0].shape == (1, 6, 6)


def test_imagefolder_needs_class_subfolders(tmp_path):
    write_png(tmp_path / "only" / "a.png", np.random.default_rng(0))
    with pytest.raises(UserError, match="data.path: .* 1 class subfolder"):
        build_data(data_cfg("imagefolder", path=str(tmp_path)), seed=0)


def test_csv_string_labels_sorted(tmp_path):
    path = tmp_path / "t.csv"
    rows = ["a,b,label"] + [f"{i},{i % 3 * 1.5},{'yes' if i % 2 else 'no'}" for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    bundle = build_data(data_cfg("csv", path=str(path), normalize="none"), seed=0)
    info = bundle.info
    assert (info.modality, info.input_shape, info.class_names) == ("tabular", (2,), ("no", "yes"))
    check_bundle(bundle)
    x, y = bundle.test[0]
    assert x.dtype == torch.float32 and int(y) == int(x[0]) % 2  # "yes" (odd a) is class 1
    assert bundle.preprocess["feature_names"] == ["a", "b"]


def test_csv_int_labels_sorted_numerically_or_declared(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("target,f\n" + "".join(f"{c},{i}\n" for i in range(30) for c in (10, 9, 2) if i % 3 == c % 3))
    cfg = data_cfg("csv", path=str(path), args={"label_column": "target"})
    assert build_data(cfg, seed=0).info.class_names == ("2", "9", "10")
    cfg = data_cfg("csv", path=str(path), args={"label_column": "target", "classes": [10, 9, 2]})
    assert build_data(cfg, seed=0).info.class_names == ("10", "9", "2")


def test_csv_missing_label_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match=r"data.args.label_column: column 'label' is not in t.csv \(columns: a, b\)"):
        build_data(data_cfg("csv", path=str(path)), seed=0)


def test_jsonl_bytes_tokenizer(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [json.dumps({"text": f"message {i} " + "ab" * i, "label": ["pos", "neg"][i % 2]}) for i in range(30)]
    path.write_text("\n".join(lines) + "\n")
    bundle = build_data(data_cfg("jsonl", path=str(path), args={"seq_len": 16}), seed=0)
    info = bundle.info
    assert (info.modality, info.input_dtype, info.vocab_size, info.seq_len, info.class_names) == (
        "text", "int64", 257, 16, ("neg", "pos"))
    check_bundle(bundle)
    assert bundle.preprocess["tokenizer"] == "bytes" and bundle.preprocess["seq_len"] == 16
    assert bundle.report["normalization"] == {"kind": "none"}


def test_textfile_contiguous_windows(tmp_path):
    corpus = bytes(range(256)) * 20  # 5120 bytes
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_bytes(corpus[:3000])
    (tmp_path / "corpus" / "b.md").write_bytes(corpus[3000:])
    (tmp_path / "corpus" / "skip.bin").write_bytes(b"\xff" * 100)
    cfg = data_cfg("textfile", path=str(tmp_path / "corpus"), args={"block_size": 31}, val_fraction=0.1, test_fraction=0.2)
    bundle = build_data(cfg, seed=0)
    assert bundle.info.task == "lm" and bundle.info.vocab_size == 256 and bundle.info.input_shape == (31,)
    report = check_bundle(bundle)
    assert report["rows_kept"] == len(corpus) // 32 and report["corpus_bytes"] == len(corpus)
    assert report["split_method"] == "contiguous"
    # windows tile the corpus in order: train, then val, then test; no overlap
    ordered = [bundle.train[(0, i)] for i in range(len(bundle.train))] + [bundle.val[i] for i in range(len(bundle.val))] \
        + [bundle.test[i] for i in range(len(bundle.test))]
    joined = b"".join(bytes(x.tolist()) + bytes(y[-1:].tolist()) for x, y in ordered)
    assert joined == corpus[: len(ordered) * 32]


def test_textfile_python_stdlib_corpus_is_deterministic():
    cfg = data_cfg("textfile", args={"corpus": "python_stdlib", "max_bytes": 20_000, "block_size": 64})
    a, b = build_data(cfg, seed=0), build_data(cfg, seed=1)
    assert a.report["corpus_bytes"] == 20_000 and a.report["rows_kept"] == 20_000 // 65
    assert torch.equal(a.test[0][0], b.test[0][0])
    assert b"import" in bytes(torch.cat([a.train[(0, i)][0] for i in range(len(a.train))]).tolist())


def test_textfile_needs_path_or_corpus():
    with pytest.raises(UserError, match="data.path: required for data source 'textfile'"):
        build_data(data_cfg("textfile"), seed=0)


def test_torchvision_fakedata():
    cfg = data_cfg(
        "torchvision",
        args={"name": "FakeData", "image_size": 6, "kwargs": {"size": 60, "image_size": [3, 10, 10], "num_classes": 3}},
    )
    before = torch.get_rng_state()
    bundle = build_data(cfg, seed=0)
    assert torch.equal(before, torch.get_rng_state())
    assert bundle.info.input_shape == (3, 6, 6) and bundle.info.num_classes == 3
    report = check_bundle(bundle)
    assert report["rows_read"] == 60 and report["split_method"] == "stratified"


def test_torchvision_missing_files_suggest_download(tmp_path):
    cfg = data_cfg("torchvision", args={"name": "MNIST", "root": str(tmp_path)})
    with pytest.raises(UserError, match=r"data.args.root: MNIST is not in .*set data.download=true"):
        build_data(cfg, seed=0)
    assert not any(tmp_path.rglob("*.gz")), "nothing may be downloaded"


def test_torchvision_unknown_name():
    with pytest.raises(UserError, match=r"data.args.name: 'Nope' is not a torchvision dataset; choose one of: .*MNIST"):
        build_data(data_cfg("torchvision", args={"name": "Nope"}), seed=0)


def test_torchvision_keeps_its_own_test_split(monkeypatch):
    """A dataset class with a `train` flag: its test part stays the test split; val comes from train."""
    import torchvision.datasets

    class Tiny(torchvision.datasets.FakeData):
        def __init__(self, root, train=True, download=False):
            super().__init__(size=40 if train else 10, image_size=(1, 4, 4), num_classes=2, random_offset=0 if train else 1000)

    monkeypatch.setattr(torchvision.datasets, "Tiny", Tiny, raising=False)
    bundle = build_data(data_cfg("torchvision", args={"name": "Tiny"}, val_fraction=0.25), seed=0)
    assert bundle.report["splits"] == {"train": 30, "val": 10, "test": 10}
    assert list(bundle.test.indices) == list(range(40, 50))
    assert bundle.report["split_method"].startswith("dataset test split")


CUSTOM_MODULE = '''
import numpy as np
import torch
from trainforge.data.base import DataBundle, DataInfo

def images(n=40, classes=2):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 1, 4, 4)).astype("float32"), np.arange(n) % classes

def table(n=30):
    return torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n) % 3

def ready():
    info = DataInfo("classification", "tabular", (1,), "float32", 2)
    return DataBundle(info, [], [], [], report={"source": "mine"})

def cube():
    return np.zeros((4, 2, 2)), np.zeros(4)

raise_on_import = None
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_data_factories.py").write_text(CUSTOM_MODULE)
    (tmp_path / "broken_factories.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_data_factories"
    for name in ("my_data_factories", "broken_factories"):
        sys.modules.pop(name, None)


def test_custom_arrays_image_and_tabular(user_module):
    bundle = build_data(data_cfg("custom", target=f"{user_module}:images", args={"n": 50, "classes": 5}), seed=0)
    assert bundle.info.modality == "image" and bundle.info.input_shape == (1, 4, 4) and bundle.info.num_classes == 5
    check_bundle(bundle)
    tab = build_data(data_cfg("custom", target=f"{user_module}:table"), seed=0)
    assert tab.info.modality == "tabular" and tab.info.input_shape == (3,)
    check_bundle(tab)


def test_custom_ready_bundle_passes_through(user_module):
    bundle = build_data(data_cfg("custom", target=f"{user_module}:ready"), seed=0)
    assert bundle.report == {"source": "mine"}


@pytest.mark.parametrize(
    "target, args, message",
    [
        (None, {}, "data.target: required for a custom data"),
        ("no_colon_here", {}, "data.target: expected 'pkg.module:factory'"),
        ("broken_factories:make", {}, r"data.target: importing 'broken_factories' failed: ModuleNotFoundError: .*broken_factories.py:1\)"),
        ("my_data_factories:missing", {}, "data.target: module 'my_data_factories' has no attribute 'missing'"),
        ("my_data_factories:images", {"bogus": 1}, r"data.args.bogus: unknown argument .*accepted: n, classes"),
        ("my_data_factories:cube", {}, r"data.target: factory returned X of shape \(4, 2, 2\)"),
    ],
)
def test_custom_errors_name_the_field(user_module, target, args, message):
    with pytest.raises(UserError, match=message):
        build_data(data_cfg("custom", target=target, args=args), seed=0)


@pytest.mark.parametrize(
    "source, args, message",
    [
        ("synthetic_images", {"num_samples": 0}, r"data.args.num_samples: .*greater than 0"),
        ("synthetic_images", {"size": 8}, r"data.args.size: unknown argument .*valid: num_samples, image_size, channels, num_classes"),
        ("synthetic_text", {"task": "translate"}, r"data.args.task: .*'classification' or 'lm'"),
        ("csv", {"label": "y"}, r"data.args.label: unknown argument for data source 'csv'; valid: label_column, classes"),
        ("jsonl", {"seq_len": "long"}, r"data.args.seq_len: .*integer"),
        ("textfile", {"block": 3}, r"data.args.block: unknown argument"),
        ("torchvision", {}, r"data.args.name: required by data source .torchvision."),
        ("imagefolder", {"image_size": -1}, r"data.args.image_size"),
    ],
)
def test_bad_args_are_user_errors(source, args, message):
    with pytest.raises(UserError, match=message):
        build_data(data_cfg(source, args=args, path="/nonexistent"), seed=0)


@pytest.mark.parametrize("source", ["imagefolder", "csv", "jsonl", "textfile"])
def test_missing_path_is_a_user_error(source, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(UserError, match=rf"data.path: {missing} does not exist; point it at"):
        build_data(data_cfg(source, path=str(missing)), seed=0)
    with pytest.raises(UserError, match="data.path: required"):
        build_data(data_cfg(source), seed=0)
