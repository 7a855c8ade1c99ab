"""Files that someone else made (issue 40), laid under the data root of a real `trainforge server` and submitted
through its API: a model folder whose classes are its own code, a pickle in a weights file, a truncated safetensors
file, shard indexes that are not what trainforge writes, and a sequence length beyond the model's positions. Each
is refused at admission with one line (no job, so no restart), the folder's code never runs unless the operator
allows it and the recipe opts in, and neither the server's log nor any job's log holds a traceback. The files are
built by tests/hostile_files.py, as for the command line's test (tests/e2e/test_hostile_files.py)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from jobs_helpers import CLIENT, ServerProcess as Server, landlock_missing, wait_for
from hostile_files import RAN, WDS, hostile_index, hostile_model_files

QUICK = ["train.max_steps=2", "train.global_batch_size=4", "train.micro_batch_size=4", "train.eval_every_steps=2",
         "train.early_stopping=null", "schedule.warmup_steps=0", "data.num_workers=0", "log.progress=false",
         "log.tensorboard=false", "log.report=false"]


def refused(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text[-2000:])
    detail = r.json()["detail"]
    assert "\n" not in detail and "Traceback" not in detail, detail
    for w in words:
        assert w in detail, detail
    return detail


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> dict[str, Path]:
    """The data root and what lies under it: the hostile folders and files, and data for them."""
    data = tmp_path_factory.mktemp("root").resolve()
    return {**hostile_model_files(data, data.parent / "evil-ran", data.parent / "pickle-ran"), "data": data}


def lm(root: dict, model: Path, *extra: str) -> list[str]:
    return [f"data.path={root['text']}", f"model.args.pretrained={model}", "data.args.block_size=32",
            "data.val_fraction=0.1", "data.test_fraction=0.1", *QUICK, *extra]


def logs(server: Server) -> dict[Path, str]:
    return {log: log.read_text(errors="replace") for log in [server.log, *server.job_logs()]}


def no_traceback(server: Server) -> None:
    for log, text in logs(server).items():
        assert "Traceback" not in text, f"{log}:\n{text[-3000:]}"


@pytest.mark.slow
def test_hostile_files_are_refused_at_admission_in_one_line(root, tmp_path):
    from PIL import Image

    images = root["data"] / "images"
    for i in range(16):
        folder = images / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i * 10, 0, 0)).save(folder / f"{i}.png")
    prepared = subprocess.run([sys.executable, "-m", "trainforge", "data", "prepare", "digits_cnn",
                               "data.source=imagefolder", f"data.path={images}", "--format", "webdataset", "--out",
                               str(tmp_path / "shards")], capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    indexes = {kind: shutil.move(str(hostile_index(tmp_path / "shards", tmp_path, kind)), root["data"] / f"wds-{kind}")
               for kind in ("pickle", "huge", "negative")}

    with Server(tmp_path, root["data"]) as server:
        detail = refused(server.submit("causal_lm_finetune", *lm(root, root["remote"])),
                         "model.args.pretrained", "own code", "trust_remote_code")
        assert "evil.py" not in detail  # the folder's content (its auto_map) is not echoed to a submitter
        refused(server.submit("causal_lm_finetune", *lm(root, root["remote"], "model.args.trust_remote_code=true")),
                "model.args.trust_remote_code", "--allow-remote-code")
        refused(server.submit("causal_lm_finetune", *lm(root, root["pickled"])),
                "pytorch_model.bin is a pickle that holds more than tensors")
        refused(server.submit("causal_lm_finetune", *lm(root, root["truncated"])),
                "model.safetensors is a damaged or truncated safetensors file")
        for kind, says in (("pickle", "a pickle (object dtype)"), ("huge", "reaches past the end of its tar"),
                           ("negative", "a negative offset or size")):
            refused(server.submit("digits_cnn", f"data.path={indexes[kind]}", *WDS, *QUICK),
                    "train-00000.idx.npy is not a shard index trainforge writes", says)
        refused(server.submit("llm_lora_sft", f"data.path={root['chats']}", f"model.args.pretrained={root['short']}",
                              "data.args.seq_len=512", *QUICK), "512 tokens", "128 positions")
        assert httpx.get(server.url + "/api/jobs", timeout=10).json() == []  # nothing admitted: no job, no restart
    assert not root["marker"].exists() and not root["pwned"].exists()
    assert not any(RAN in text for text in logs(server).values())  # the folder's code ran nowhere, not in a check
    no_traceback(server)


@pytest.mark.slow
def test_an_operator_who_allows_remote_code_runs_a_recipe_that_opts_in(root, tmp_path):
    with Server(tmp_path, root["data"], "--allow-remote-code") as server:
        refused(server.submit("causal_lm_finetune", *lm(root, root["remote"])), "own code")  # still needs the opt-in
        assert RAN not in server.log.read_text()
        r = server.submit("causal_lm_finetune", *lm(root, root["remote"], "model.args.trust_remote_code=true"))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        def job() -> dict:
            return httpx.get(f"{server.url}/api/jobs/{job_id}", timeout=10).json()

        wait_for(lambda: job()["state"] in ("succeeded", "failed", "cancelled"), 300, "the job to end", 0.5)
        assert job()["state"] == "succeeded" and job()["restarts"] == 0, server.job_logs()[0].read_text()[-3000:]
    assert RAN in server.job_logs()[0].read_text()  # it ran in the job
    if not landlock_missing():  # inside the job's fence, which kept it from writing outside the job's folders
        assert not root["marker"].exists()
    root["marker"].unlink(missing_ok=True)
    no_traceback(server)
