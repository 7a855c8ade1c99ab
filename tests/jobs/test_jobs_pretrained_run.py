"""`trainforge jobs submit` of the shipped fine-tuning recipe with a model folder and texts under the server's data
root: admitted (the folder confined, sized by the planner), run by the queue in a job process of its own and
succeeded, with the model transformers loads. (The admission rules themselves: test_jobs_pretrained_security.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from jobs_helpers import LiveServer, make_service, wait_for
from test_jobs_cli import cli
from tiny_models import corpus, save_tiny_bert, write_labelled_texts


@pytest.mark.slow
def test_a_fine_tuning_job_on_a_model_folder_under_a_data_root_runs_to_success(tmp_path, data_root, capsys,
                                                                                monkeypatch):
    from transformers import AutoModelForSequenceClassification

    monkeypatch.chdir(tmp_path)
    bert = save_tiny_bert(data_root / "models" / "bert")
    texts = write_labelled_texts(data_root / "reviews.jsonl", corpus(120))
    quick = [f"data.path={texts}", f"model.args.pretrained={bert}", "data.args.seq_len=16", "train.max_steps=6",
             "train.eval_every_steps=3", "train.global_batch_size=16", "train.early_stopping=null",
             "schedule.warmup_steps=0", "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.report=false"]
    with LiveServer(make_service(tmp_path, "cpu:1", data_roots=[data_root])) as server:
        monkeypatch.setenv("TRAINFORGE_SERVER", server.url)
        code, out, err = cli(capsys, "jobs", "submit", "textcls_finetune", *quick, "--json")
        assert code == 0, err
        job_id = json.loads(out)["id"]

        def shown() -> dict:
            code, out, err = cli(capsys, "jobs", "show", str(job_id), "--json")
            assert code == 0, err
            return json.loads(out)

        wait_for(lambda: shown()["state"] in ("succeeded", "failed", "cancelled"), 180, "the job to end", 0.5)
        job = shown()
        code, log, _ = cli(capsys, "jobs", "logs", str(job_id))
    assert job["state"] == "succeeded", log[-3000:]
    frozen = yaml.safe_load(job["config_yaml"])
    assert frozen["model"]["args"]["pretrained"] == str(bert) and frozen["data"]["from_model"]["source"] == str(bert)
    assert job["progress"]["step"] == 6 and "test accuracy" in log
    run_dir = Path(job["run_dir"])
    assert 0.0 <= json.loads((run_dir / "eval.json").read_text())["accuracy"] <= 1.0
    AutoModelForSequenceClassification.from_pretrained(run_dir / "final" / "hf")  # fine-tuned, loadable anywhere
