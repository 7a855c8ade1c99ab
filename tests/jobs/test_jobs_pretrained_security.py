"""Pretrained models named by a submission, attacked as another user of the machine would: another user's model
folder by path, `~`, `..` and relative names, symbolic links into and inside a data root, a config.json or an
inline config that names files elsewhere, a hub id that would make the server download, names with hub or
local-dir prefixes, and the same through timm, torchvision weights and data.from_model. Each attack goes
through the API (the server's own admission), and each refusal comes before the size check loads anything."""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import yaml

with warnings.catch_warnings():  # starlette's note about its httpx-based TestClient is not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from jobs_helpers import QUICK, make_service
from trainforge.errors import UserError
from trainforge.jobs.admission import load_submission
from trainforge.jobs.pretrained import hub_env, is_hub_id, looks_like_path
from trainforge.jobs.runner import start_attempt
from trainforge.layout import JobDir
from trainforge.jobs.server import create_app

CLIENT = {"X-Trainforge-Client": "test"}
TEXT = [*QUICK, "data.source=synthetic_text", "data.args={task: classification, num_samples: 64, seq_len: 16, "
        "vocab_size: 257, num_classes: 2}", "data.normalize=none", "data.augment.rotation_deg=0",
        "data.augment.crop_scale=null", "train.global_batch_size=8", "train.micro_batch_size=8"]
INLINE_BERT = "{model_type: bert, vocab_size: 300, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, " \
              "intermediate_size: 64}"
SECRET = "ALICE-PRIVATE-0451"  # in the other user's files: no answer may ever quote it


def hf(pretrained: str, *extra: str) -> dict:
    return {"recipe": "digits_cnn", "overrides": [*TEXT, "model.name=hf", f"model.args={{pretrained: '{pretrained}'}}",
                                                  *extra]}


def job(*overrides: str) -> dict:
    return {"recipe": "digits_cnn", "overrides": [*QUICK, *overrides]}


def save_bert(path: Path) -> Path:
    """A tiny BERT classifier as save_pretrained writes it (config.json + model.safetensors)."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertForSequenceClassification(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return save_bert(tmp_path_factory.mktemp("bert") / "model")


@pytest.fixture
def alice(tmp_path) -> Path:
    """Another user's private model folder and weights file, outside the server's data roots."""
    home = tmp_path / "home" / "alice"
    model = home / "private-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "bert", "secret": SECRET}))
    (home / "weights.pth").write_text(SECRET)
    return home


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """Empty Hugging Face and torch hub caches: nothing is cached unless a test puts it there."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    return cache


@pytest.fixture
def api(tmp_path, data_root, hub_cache):
    """The API of a server with one data root, whose size check must never run: every refusal comes first."""
    service = make_service(tmp_path, data_roots=[data_root])

    def no_size_check(*_args, **_kwargs):
        raise AssertionError("the submission reached the size check, which loads the model")

    service.checker.size = no_size_check
    with TestClient(create_app(service, manage_service=False), headers=CLIENT) as c:
        yield c


def refused(r, *words: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert "\n" not in detail and SECRET not in detail, detail
    for w in words:
        assert w in detail, detail
    return detail


# ---------------------------------------------------------------- model.args.pretrained (hf): paths


def test_paths_to_another_users_model_are_refused(api, data_root, alice):
    private = alice / "private-model"
    for value, why in [(str(private), "outside the server's data roots"),
                       (f"{data_root}/../home/alice/private-model", "outside the server's data roots"),
                       ("~/private-model", "not an absolute path"),
                       ("~alice/private-model", "not an absolute path"),
                       ("~", "not an absolute path"),
                       ("../home/alice/private-model", "not an absolute path"),
                       ("./private-model", "not an absolute path"),
                       ("home/alice/private-model", "not an absolute path"),
                       (".cache", "not an absolute path")]:
        refused(api.post("/api/jobs", json=hf(value)), "model.args.pretrained", why)


def test_symbolic_links_out_of_a_data_root_are_refused(api, data_root, alice):
    (data_root / "escape").symlink_to(alice / "private-model")
    mixed = data_root / "mixed"  # a real folder under the root whose config.json is a link out of it
    mixed.mkdir()
    (mixed / "config.json").symlink_to(alice / "private-model" / "config.json")
    nested = data_root / "nested" / "sub"
    nested.mkdir(parents=True)
    (nested / "tokenizer.json").symlink_to(alice / "weights.pth")
    for value in (data_root / "escape", mixed, data_root / "nested"):
        refused(api.post("/api/jobs", json=hf(str(value))), "model.args.pretrained", "symbolic link")


def test_a_config_naming_files_elsewhere_is_refused_without_quoting_it(api, data_root, alice):
    backbone = data_root / "backbone"  # transformers would build a timm backbone from alice's folder
    backbone.mkdir()
    (backbone / "config.json").write_text(json.dumps(
        {"model_type": "timm_backbone", "backbone": f"local-dir:{alice / 'private-model'}", "note": SECRET}))
    shards = data_root / "shards"  # a weight shard "inside" the folder that climbs out of it
    shards.mkdir()
    (shards / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "../../home/alice/weights.pth"}}))
    broken = data_root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{" * 100_000)
    for folder, why in [(backbone, "config.json in it names a file outside the folder"),
                        (shards, "model.safetensors.index.json in it names a file outside the folder"),
                        (broken, "config.json in it is not valid JSON")]:
        detail = refused(api.post("/api/jobs", json=hf(str(folder))), "model.args.pretrained", why)
        assert "alice" not in detail, detail  # the file is quoted by name, never by content


def test_an_inline_config_may_not_name_files(api, alice):
    for config, field in [(f"{{model_type: timm_backbone, backbone: 'local-dir:{alice}/private-model'}}",
                           "model.args.config.backbone"),
                          ("{model_type: bert, text_config: {name: '~/private-model'}}", "model.args.config.text_config.name"),
                          ("{model_type: bert, files: [a, '../../etc/passwd']}", "model.args.config.files[1]")]:
        refused(api.post("/api/jobs", json=job(*TEXT, "model.name=hf", f"model.args={{pretrained: false, config: {config}}}")),
                field, "may not name files")
    refused(api.post("/api/jobs", json=job(*TEXT, "model.name=hf", f"model.args={{pretrained: false, config: '{alice}'}}")),
            "model.args.config", "outside the server's data roots")


def test_without_data_roots_no_pretrained_path_is_accepted(tmp_path, bert, hub_cache):
    with TestClient(create_app(make_service(tmp_path), manage_service=False), headers=CLIENT) as c:
        refused(c.post("/api/jobs", json=hf(str(bert))), "model.args.pretrained", "--data-root")


# ---------------------------------------------------------------- hub ids


@pytest.mark.parametrize("value", ["org/na:me", "a" * 97, "org/..", "org/x..y", "x--y", "hf-hub:org/name", "org/",
                                   "-x", "org name", "ünï/code", "org/name.", "org/.name", "org/name.git"])
def test_names_outside_the_hub_id_grammar_are_refused(api, value):
    refused(api.post("/api/jobs", json=hf(value)), "model.args.pretrained")


def test_an_uncached_hub_id_is_refused_with_the_fix(api, tmp_path, monkeypatch, bert):
    # a folder of that name in the server's working directory changes nothing: it is still a hub id
    monkeypatch.chdir(tmp_path)
    os.symlink(bert, tmp_path / "bert-tiny")
    (tmp_path / "org").mkdir()
    os.symlink(bert, tmp_path / "org" / "name")
    for value in ("bert-tiny", "org/name", "bert-base-uncased"):
        refused(api.post("/api/jobs", json=hf(value)), "model.args.pretrained", "not in this server's Hugging Face cache",
                f"hf download {value}", "--allow-hub-downloads")
    refused(api.post("/api/jobs", json=job(*TEXT, "model.name=hf", "model.args={pretrained: false, config: org/cfg}")),
            "model.args.config", "hf download org/cfg")


def test_a_cached_hub_id_is_accepted_as_is_and_downloads_need_the_operator(tmp_path, hub_cache):
    snapshot = hub_cache / "models--org--name" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (hub_cache / "models--org--name" / "refs").mkdir()
    (hub_cache / "models--org--name" / "refs" / "main").write_text("0" * 40)
    cfg = load_submission("digits_cnn", None, [*TEXT, "model.name=hf", "model.args={pretrained: org/name}"])
    assert cfg.model.args["pretrained"] == "org/name"
    with pytest.raises(UserError, match="not in this server's Hugging Face cache"):
        load_submission("digits_cnn", None, [*TEXT, "model.name=hf", "model.args={pretrained: org/other}"])
    cfg = load_submission("digits_cnn", None, [*TEXT, "model.name=hf", "model.args={pretrained: org/other}"],
                          allow_hub_downloads=True)
    assert cfg.model.args["pretrained"] == "org/other"  # the operator opted in: the check and the job may fetch it
    with pytest.raises(UserError, match="not an absolute path"):  # a path is a path, downloads or not
        load_submission("digits_cnn", None, [*TEXT, "model.name=hf", "model.args={pretrained: ./org/other}"],
                        data_roots=[tmp_path], allow_hub_downloads=True)


def test_the_checks_and_the_jobs_run_offline_without_the_servers_hub_token(tmp_path):
    env = {"PATH": os.environ.get("PATH", ""), "HF_TOKEN": "hf_operator", "HUGGING_FACE_HUB_TOKEN": "hf_operator"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    offline = make_service(tmp_path / "a", env=env)
    for job_env in (offline.env, offline.checker.child_env):
        assert job_env["HF_HUB_OFFLINE"] == "1" and job_env["TRANSFORMERS_OFFLINE"] == "1"
        assert job_env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] == "1"
    assert "HF_TOKEN" not in offline.env and "HUGGING_FACE_HUB_TOKEN" not in offline.env
    online = make_service(tmp_path / "b", env=env, allow_hub_downloads=True)
    assert "HF_HUB_OFFLINE" not in online.env and "HF_HUB_OFFLINE" not in online.checker.child_env
    assert online.env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] == "1" and "HF_TOKEN" not in online.env
    assert hub_env(False)["HF_HUB_OFFLINE"] == "1"


def test_a_job_runs_in_its_own_directory(tmp_path):
    paths = JobDir(tmp_path / "jobs" / "1")
    code = "import os, pathlib; pathlib.Path('cwd.txt').write_text(os.getcwd())"
    start_attempt(paths, [sys.executable, "-c", code], dict(os.environ), "test").wait(timeout=60)
    assert (paths.path / "cwd.txt").read_text() == str(paths.path)


def test_the_grammar():
    assert all(is_hub_id(v) for v in ("bert-base-uncased", "org/name", "Org_1/name.v2", "a", "a" * 96))
    assert not any(is_hub_id(v) for v in ("a" * 97, "a/b/c", "../x", "x..y", "x--y", ".x", "x.", "org/", "/x", "a:b"))
    assert all(looks_like_path(v) for v in ("/x", "~", "~/x", "./x", "../x", ".x", "a/b/c", "a\\b"))
    assert not any(looks_like_path(v) for v in ("bert-base-uncased", "org/name"))


# ---------------------------------------------------------------- timm, torchvision weights, data.from_model


def test_timm_weights_files_and_names(api, alice):
    timm = ["model.name=timm", "data.augment.rotation_deg=0"]
    refused(api.post("/api/jobs", json=job(*timm, f"model.args={{arch: resnet18, pretrained: '{alice}/weights.pth'}}")),
            "model.args.pretrained", "outside the server's data roots")
    refused(api.post("/api/jobs", json=job(*timm, "model.args={arch: resnet18, pretrained: weights.pth}")),
            "model.args.pretrained", "not an absolute path")
    refused(api.post("/api/jobs", json=job(*timm, "model.args={arch: resnet18, pretrained: true}")),
            "model.args.pretrained", "timm's weights for 'resnet18' are not in this server's", "--allow-hub-downloads")
    refused(api.post("/api/jobs", json=job(*timm, "model.args={arch: 'hf-hub:timm/resnet18.a1_in1k'}")),
            "model.args.arch", "not a timm model name")
    refused(api.post("/api/jobs", json=job(*timm, f"model.args={{arch: 'local-dir:{alice}'}}")), "model.args.arch")


def test_torchvision_weights_files_and_names(api, alice):
    resnet = ["model.name=resnet"]
    for weights, why in [(f"{alice}/weights.pth", "outside the server's data roots"),
                         ("r18.pth", "not an absolute path"), ("~/weights.pth", "not an absolute path"),
                         ("DEFAULT", "not in this server's torch hub cache"), ("NOPE", "not a weight set of resnet18")]:
        refused(api.post("/api/jobs", json=job(*resnet, f"model.args={{arch: resnet18, weights: '{weights}'}}")),
                "model.args.weights", why)
    refused(api.post("/api/jobs", json=job(*resnet, "model.args={arch: resnet18, weights: 5}")), "model.args.weights")


def test_detector_segmenter_and_fusion_weights_are_checked_at_admission(api, alice):
    """Issue 51, point 5: what the detector, segmenter and fusion families load is declared with the others
    (trainforge/weights.py) and judged at admission: their defaults (a detector's COCO weights) too."""
    boxes = ["model.name=detector", "data.normalize=none"]
    refused(api.post("/api/jobs", json=job(*boxes)),  # pretrained: true by default: torchvision's COCO weights
            "model.args.pretrained", "fasterrcnn_mobilenet_v3_large_fpn", "not in this server's torch hub cache")
    refused(api.post("/api/jobs", json=job(*boxes, "model.args={pretrained: false, backbone_weights: true}")),
            "model.args.backbone_weights", "mobilenet_v3_large", "not in this server's torch hub cache")
    refused(api.post("/api/jobs", json=job(*boxes, f"model.args={{pretrained: '{alice}/weights.pth'}}")),
            "model.args.pretrained", "outside the server's data roots")
    refused(api.post("/api/jobs", json=job(*boxes, "model.args={pretrained: false, backbone: 'timm:resnet18', "
                                                   f"backbone_weights: '{alice}/weights.pth'}}")),
            "model.args.backbone_weights", "outside the server's data roots")
    refused(api.post("/api/jobs", json=job(*boxes, "model.args={pretrained: false, backbone: 'timm:resnet18', "
                                                   "backbone_weights: true}")),
            "model.args.backbone_weights", "timm's weights for 'resnet18' are not in this server's")
    masks = ["model.name=segmenter", "data.normalize=none"]
    refused(api.post("/api/jobs", json=job(*masks, "model.args={arch: fcn_resnet50, pretrained: false, "
                                                   "backbone_weights: true}")),
            "model.args.backbone_weights", "resnet50", "not in this server's torch hub cache")
    refused(api.post("/api/jobs", json=job(*masks, "model.args={pretrained: r.pth}")),
            "model.args.pretrained", "not an absolute path")
    refused(api.post("/api/jobs", json=job("model.name=fusion", "model.args={image_encoder: 'timm:resnet18', "
                                                                "image_pretrained: true}")),
            "model.args.image_pretrained", "timm's weights for 'resnet18' are not in this server's")


def test_every_family_that_takes_weights_declares_them_and_its_defaults_are_the_builders():
    """A model family whose builder takes a weights setting has a declaration in trainforge/weights.py (else the
    admission and the job files would not see what it loads); the defaults declared there are the builder's."""
    import inspect

    from trainforge import weights
    from trainforge.models.zoo import MODELS

    import trainforge.models  # noqa: F401  (registers the shipped families)

    settings = {"pretrained", "weights", "backbone_weights", "image_pretrained", "config"}
    taking = {name for name in MODELS.names() if set(inspect.signature(MODELS.get(name)).parameters) & settings}
    assert {"hf", "timm", "resnet", "detector", "segmenter", "fusion"} <= taking, taking
    assert not taking - set(weights.LOADS), f"declare what these families load: {sorted(taking - set(weights.LOADS))}"
    for family, defaults in (("detector", weights.DETECTOR_DEFAULTS), ("segmenter", weights.SEGMENTER_DEFAULTS)):
        params = inspect.signature(MODELS.get(family)).parameters
        assert {k: params[k].default for k in defaults} == defaults, family


def test_data_from_model_is_held_to_the_same_rules(api, alice):
    model = f"model.args={{pretrained: false, config: {INLINE_BERT}}}"
    for from_model, why in [(f"{{family: hf, source: '{alice}/private-model'}}", "outside the server's data roots"),
                            ("{family: hf, source: '~/private-model'}", "not an absolute path"),
                            ("{family: hf, source: org/uncached}", "not in this server's Hugging Face cache")]:
        refused(api.post("/api/jobs", json=job(*TEXT, "model.name=hf", model, "data.tokenizer=model",
                                               f"data.from_model={from_model}")), "data.from_model.source", why)
    refused(api.post("/api/jobs", json=job("data.from_model={family: timm, source: "
                                           f"'local-dir:{alice}'}}")), "data.from_model.source", "not a timm model name")
    refused(api.post("/api/jobs", json=job("data.from_model={family: torchvision, source: "
                                           f"resnet18, weights: '{alice}/weights.pth'}}")), "data.from_model.weights",
            "outside the server's data roots")


def test_a_tokenizer_taken_from_the_model_follows_the_models_path(api, alice):
    """data.tokenizer: model without data.from_model takes the model's source: refused for the same reason."""
    refused(api.post("/api/jobs", json=hf(str(alice / "private-model"), "data.tokenizer=model")),
            "model.args.pretrained", "outside the server's data roots")


# ---------------------------------------------------------------- the positive case


def test_a_pretrained_folder_under_a_data_root_is_accepted(tmp_path, data_root, bert, hub_cache):
    import shutil

    shutil.copytree(bert, data_root / "models" / "bert")
    (data_root / "current").symlink_to(data_root / "models" / "bert")  # a link that stays inside the root
    service = make_service(tmp_path, data_roots=[data_root])
    with TestClient(create_app(service, manage_service=False), headers=CLIENT) as c:
        r = c.post("/api/jobs", json=hf(str(data_root / "current")))
        assert r.status_code == 201, r.text
        frozen = yaml.safe_load(c.get(f"/api/jobs/{r.json()['id']}").json()["config_yaml"])
    assert frozen["model"]["args"]["pretrained"] == str(data_root / "models" / "bert")  # the real path, checked


def test_a_job_checks_the_folder_again_when_it_loads_it(data_root, bert, alice, monkeypatch):
    """Admitted, then changed: a link leading out, added to the folder after admission, stops the job's loader
    (the job process has the server's roots in its environment); the command line is not confined."""
    import shutil

    from transformers import AutoConfig

    from trainforge.confine import ENV, roots_env
    from trainforge.hub import from_hub

    folder = data_root / "bert"
    shutil.copytree(bert, folder)
    monkeypatch.setenv(ENV, roots_env([data_root]))
    assert from_hub(AutoConfig.from_pretrained, str(folder), "config", field="model.args.pretrained").hidden_size == 32
    (folder / "tokenizer.json").symlink_to(alice / "weights.pth")
    with pytest.raises(UserError, match=r"model.args.pretrained: .*symbolic link"):
        from_hub(AutoConfig.from_pretrained, str(folder), "config", field="model.args.pretrained")
    from trainforge.models.resnet import pretrained_state

    with pytest.raises(UserError, match=r"model.args.weights: .*outside the server's data roots"):
        pretrained_state("resnet18", str(alice / "weights.pth"))
    monkeypatch.delenv(ENV)
    assert from_hub(AutoConfig.from_pretrained, str(folder), "config", field="model.args.pretrained").hidden_size == 32
