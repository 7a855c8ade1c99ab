"""`trainforge launch` of fine-tuning recipes: the job file names the pretrained models its nodes load and where
they find them, warns when that is a local path, and carries the cache environment like any other (--env)."""
from __future__ import annotations

import json
import subprocess
import warnings

import pytest
import yaml
from test_manifests import FAKE_SCONTROL, FAKE_SRUN, _fake_bin

from trainforge.config import load_config
from trainforge.launch.manifests import Pretrained, launch_text, pretrained_sources


def quietly(*args, **options) -> str:
    """launch_text, asserting that it warns of nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return launch_text(*args, **options)


def notes(text: str) -> list[str]:
    """The comment block about pretrained models at the top of a job file."""
    lines = text.splitlines()[1:] if text.startswith("#!") else text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Pretrained models this job loads"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("#   "))
    return lines[start:end]


def test_a_hub_id_is_named_with_its_cache_and_the_env_that_moves_the_cache():
    text = quietly("slurm", "textcls_finetune", [], env={"HF_HOME": "/shared/hf", "HF_HUB_OFFLINE": "1"})
    said = "\n".join(notes(text))
    assert "'distilbert-base-uncased' (model.args.pretrained, data.from_model.source): a Hugging Face hub id" in said
    assert "$HF_HOME" in said and "hf download" in said
    assert "export HF_HOME=/shared/hf" in text and "export HF_HUB_OFFLINE=1" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0

    config_map, job = yaml.safe_load_all(quietly("k8s", "causal_lm_finetune", [], env={"HF_HOME": "/runs/.cache/hf"}))
    assert yaml.safe_load(config_map["data"]["config.yaml"])["model"]["args"]["pretrained"] == "HuggingFaceTB/SmolLM2-135M"
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_HOME", "value": "/runs/.cache/hf"} in pod["env"]


@pytest.mark.parametrize("target, where", [("slurm", "shared filesystem"), ("k8s", "on the PVC"),
                                           ("skypilot", "file_mounts")])
def test_a_local_model_folder_is_a_warning_and_a_note_saying_where_the_nodes_need_it(target, where):
    with pytest.warns(UserWarning, match=r"model.args.pretrained and data.from_model.source: '/home/me/bert' is a "
                                         rf"local path; the job's nodes read it at that path.*{where}"):
        text = launch_text(target, "textcls_finetune", ["model.args.pretrained=/home/me/bert"])
    assert any("'/home/me/bert'" in line and "a path; it must exist there on every node" in line and where in line
               for line in notes(text))
    if target != "slurm":
        assert list(yaml.safe_load_all(text))  # the comments keep the YAML a YAML


def test_a_bare_name_is_a_hub_id_unless_a_folder_of_that_name_is_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hf = ["model.name=hf", "model.args={pretrained: my-bert}"]
    assert pretrained_sources(load_config(None, hf)) == [Pretrained(("model.args.pretrained",), "my-bert", "hf")]
    (tmp_path / "my-bert").mkdir()  # the loader would read this folder, which the nodes do not have
    assert pretrained_sources(load_config(None, hf))[0].kind == "path"


def test_timm_and_torchvision_weights_are_named_too_and_a_model_from_a_config_names_nothing():
    kinds = lambda *o: [(p.fields, p.value, p.kind) for p in pretrained_sources(load_config(None, list(o)))]  # noqa: E731
    assert kinds("model.name=timm", "model.args={arch: resnet18, pretrained: true}") == \
        [(("model.args.pretrained",), "resnet18", "timm")]
    assert kinds("model.name=timm", "model.args={arch: resnet18, pretrained: /w/r18.safetensors}")[0][2] == "path"
    assert kinds("model.name=resnet", "model.args={arch: resnet18, weights: IMAGENET1K_V1}")[0][2] == "torchvision"
    assert kinds("model.name=resnet", "model.args={arch: resnet18, weights: ./r18.pth}")[0][2] == "path"
    assert kinds("model.name=hf", "model.args={pretrained: false, config: {model_type: bert}}") == []
    assert "Pretrained models" not in quietly("slurm", "digits_cnn", [])
    # issue 51, point 5: every family's declaration is read, the detector's COCO-weights default and timm body too
    assert kinds("model.name=detector") == [(("model.args.pretrained",), "DEFAULT", "torchvision")]
    assert kinds("model.name=detector", "model.args={pretrained: false, backbone: 'timm:resnet18', "
                 "backbone_weights: true}") == [(("model.args.backbone_weights",), "resnet18", "timm")]
    assert kinds("model.name=segmenter", "model.args={pretrained: /w/seg.pth}") == \
        [(("model.args.pretrained",), "/w/seg.pth", "path")]


def test_a_path_with_a_line_break_stays_inside_its_comment(tmp_path):
    """The notes quote values with repr(): a crafted path cannot end its comment and run as a line of the script."""
    hostile = "/models/x\ntouch pwned\n"
    with pytest.warns(UserWarning, match="is a local path"):
        text = launch_text("slurm", "textcls_finetune", [f"model.args.pretrained={json.dumps(hostile)}"],
                           run_dir=str(tmp_path / "runs" / "{name}"))
    assert all(line.startswith("#") for line in notes(text))
    env = _fake_bin(tmp_path, {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL})
    env.update(SLURM_JOB_NODELIST="node-a", SLURM_JOB_ID="1")
    result = subprocess.run(["bash", "-c", text], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.rglob("pwned"))
    written = yaml.safe_load((tmp_path / "runs" / "textcls_finetune" / "job-config.yaml").read_text())
    assert written["model"]["args"]["pretrained"] == hostile  # the recipe itself, byte for byte
