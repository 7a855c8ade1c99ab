"""The Kubernetes job files `launch k8s` writes, checked against the API's own models: the Kubeflow training
operator's Python SDK (`kubeflow-training`: PyTorchJob, kubeflow.org/v1, generated from the operator's OpenAPI
spec, the kubernetes client's models inside) and Kubeflow Trainer's API models (`kubeflow-trainer-api`: TrainJob,
trainer.kubeflow.org/v1alpha1, generated from its CRDs). The kept validator: each document is read into its model
(required fields, types, enums) and written back; anything the model does not know (a misspelled key) is dropped on
the way, so the document must come back unchanged."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from trainforge.errors import UserError
from trainforge.launch.manifests import JobSpec, render

MODELS = {("v1", "ConfigMap"): "V1ConfigMap", ("kubeflow.org/v1", "PyTorchJob"): "KubeflowOrgV1PyTorchJob"}


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if type(a) is not type(b):
        return [f"{path or '/'}: {a!r:.60} became {b!r:.60}"]
    if isinstance(a, dict):
        found = [f"{path}/{k}: {'unknown to the model' if k in a else 'added by the model'}" for k in set(a) ^ set(b)]
        return found + [d for k in set(a) & set(b) for d in _differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items became {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r:.60} became {b!r:.60}"]


def validate(doc: dict[str, Any]) -> list[str]:
    """What is wrong with one Kubernetes document, by the API's models ([] when it is valid)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    try:
        if key == ("trainer.kubeflow.org/v1alpha1", "TrainJob"):
            from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

            back = TrainerV1alpha1TrainJob.from_dict(doc).to_dict()
        else:
            from kubeflow.training.api_client import ApiClient

            client = ApiClient()
            model = client._ApiClient__deserialize(doc, MODELS[key])  # the SDK's own reading of a response body
            back = client.sanitize_for_serialization(model)
    except (ValueError, TypeError, KeyError) as e:  # pydantic's ValidationError is a ValueError
        return [f"{key}: {str(e).splitlines()[0]}"]
    return _differences(doc, back)


def validate_text(text: str) -> list[str]:
    return [problem for doc in yaml.safe_load_all(text) for problem in validate(doc)]


SPECS = {
    "one node, 8 GPUs": dict(nodes=1),
    "two nodes, 4 GPUs, env, memory": dict(nodes=2, gpus_per_node=4, env={"NCCL_DEBUG": "INFO"}, mem_per_node_gib=64),
    "elastic 2:4": dict(nodes=3, min_nodes=2, max_nodes=4, gpus_per_node=2),
    "CPU only": dict(nodes=2, gpus_per_node=0, procs_per_node=3, cpus_per_gpu=2),
    "TrainJob, 2 nodes, GPUs": dict(nodes=2, gpus_per_node=4, k8s_api="trainjob", env={"A": "1"}, mem_per_node_gib=32),
    "TrainJob, CPU only": dict(nodes=1, gpus_per_node=0, procs_per_node=2, cpus_per_gpu=1, k8s_api="trainjob"),
}


@pytest.mark.parametrize("options", SPECS.values(), ids=SPECS.keys())
def test_every_k8s_job_file_is_valid_by_the_apis_models(options):
    text = render("k8s", JobSpec(name="demo", recipe_text="name: demo\ntrain:\n  epochs: 1\n", **options))
    kinds = [doc["kind"] for doc in yaml.safe_load_all(text)]
    assert kinds == ["ConfigMap", "TrainJob" if options.get("k8s_api") == "trainjob" else "PyTorchJob"]
    assert validate_text(text) == []


def test_the_validator_sees_a_misspelled_key_a_wrong_type_and_a_missing_field():
    config_map, job = yaml.safe_load_all(render("k8s", JobSpec(name="demo", recipe_text="a: 1\n", nodes=2)))
    misspelled = copy.deepcopy(job)
    misspelled["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert any("volumeMount: unknown to the model" in p for p in validate(misspelled))
    no_replicas = copy.deepcopy(job)
    del no_replicas["spec"]["pytorchReplicaSpecs"]
    assert validate(no_replicas)
    _, trainjob = yaml.safe_load_all(render("k8s", JobSpec(name="demo", recipe_text="a: 1\n", k8s_api="trainjob")))
    wrong_type = copy.deepcopy(trainjob)
    wrong_type["spec"]["trainer"]["numNodes"] = "2"
    assert validate(wrong_type)
    no_runtime = copy.deepcopy(trainjob)
    del no_runtime["spec"]["runtimeRef"]
    assert validate(no_runtime)
    assert validate(config_map) == []


def test_a_trainjob_runs_trainforge_in_the_torch_runtimes_node_container():
    config_map, job = yaml.safe_load_all(render("k8s", JobSpec(name="My Job", recipe_text="a: 1\n", nodes=2,
                                                                gpus_per_node=4, k8s_api="trainjob")))
    spec = job["spec"]
    assert spec["runtimeRef"] == {"name": "torch-distributed"}
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "4"}
    command = trainer["command"]
    assert command[:3] == ["trainforge", "train", "/etc/trainforge/config.yaml"]
    assert command[command.index("--rdzv-endpoint") + 1] == "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"
    assert command[command.index("--resume") + 1] == "auto"
    (patch,) = spec["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert replicated["name"] == "node" and pod["containers"][0]["name"] == "node"
    assert {v["name"] for v in pod["volumes"]} == {"config", "runs", "dshm"}
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    with pytest.raises(UserError, match="--min-nodes"):
        render("k8s", JobSpec(name="x", recipe_text="a: 1\n", nodes=2, min_nodes=1, max_nodes=2, k8s_api="trainjob"))
    with pytest.raises(UserError, match="--k8s-api"):
        JobSpec(name="x", recipe_text="a: 1\n", k8s_api="jobset")
