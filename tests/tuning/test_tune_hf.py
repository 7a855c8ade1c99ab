"""`trainforge tune` of the shipped fine-tuning recipe on a tiny local BERT: the trials load the pretrained model in
the worker process, train, report each evaluation to the study and leave a model transformers loads."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from test_tune_runs import load_trials, tune_cli
from tiny_models import corpus, save_tiny_bert, write_labelled_texts

from trainforge.engine.metrics import read_metrics

SPACE = """\
optim.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
optim.layer_decay: {type: float, low: 0.5, high: 1.0}
"""


@pytest.mark.slow
def test_a_two_trial_study_of_a_pretrained_bert_completes_and_reports_its_metrics(tmp_path, capsys):
    from transformers import AutoConfig

    texts = write_labelled_texts(tmp_path / "texts.jsonl", corpus(160))
    bert = save_tiny_bert(tmp_path / "bert")
    (tmp_path / "space.yaml").write_text(SPACE)
    out = tmp_path / "study"
    short = [f"data.path={texts}", f"model.args.pretrained={bert}", "data.args.seq_len=16", "train.max_steps=6",
             "train.eval_every_steps=3", "train.global_batch_size=16", "train.micro_batch_size=16",
             "train.early_stopping=null", "schedule.warmup_steps=0", "train.num_threads=1", "log.progress=false",
             "log.tensorboard=false", "log.report=false"]
    result = tune_cli(["textcls_finetune", *short, "--space", str(tmp_path / "space.yaml"), "--trials", "2",
                       "--pruner", "none", "--out", str(out)], capsys)
    assert result["counts"] == {"complete": 2, "pruned": 0, "failed": 0} and result["metric"] == "accuracy"
    trials = load_trials(out, "textcls_finetune")
    assert len({t.params["optim.lr"] for t in trials}) == 2
    for t in trials:
        assert t.state == optuna.trial.TrialState.COMPLETE and 0.0 <= t.value <= 1.0
        run_dir = Path(t.user_attrs["run_dir"])
        val = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "val"]
        assert [r["step"] for r in val] == [3, 6]
        assert list(t.intermediate_values.values()) == [r["accuracy"] for r in val]  # one report per evaluation
        assert t.value == val[-1]["accuracy"]
        assert AutoConfig.from_pretrained(run_dir / "final" / "hf").model_type == "bert"
    best = yaml.safe_load(Path(result["paths"]["best_config"]).read_text())
    assert best["model"]["name"] == "hf" and best["model"]["args"]["pretrained"] == str(bert)
    assert best["optim"]["lr"] == result["best_trial"]["params"]["optim.lr"]
