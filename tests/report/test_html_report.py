from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainforge.errors import UserError
from trainforge.report import write_report
from trainforge.metrics_file import json_safe
from trainforge.engine.metrics import MetricsLog, classification_metrics

CLASS_NAMES = ["cat", "<b>", "fox"]


def _train_row(step: int) -> dict:
    return {"split": "train", "step": step, "epoch": 0, "loss": 2.0 / step, "lr": 1e-3, "samples_per_s": 500.0 + step,
            "step_time_s": 0.1, "data_wait_frac": 0.05, "peak_mem_bytes": 300 * 2**20, "grad_norm": 1.2}


def _classification_run(run_dir: Path) -> Path:
    run_dir.mkdir()
    with MetricsLog(run_dir / "metrics.jsonl", None) as log:
        for step in range(1, 6):
            log.log(_train_row(step))
        log.log({"split": "val", "step": 5, "epoch": 0, "loss": 0.7, "accuracy": 0.8, "macro_f1": 0.75})
    metrics = classification_metrics(np.array([0, 1, 2, 2]), np.array([0, 1, 2, 1]), CLASS_NAMES)
    (run_dir / "eval.json").write_text(json.dumps(json_safe({"split": "test", "loss": 0.65, **metrics})))
    (run_dir / "data_report.json").write_text(json.dumps({
        "rows_read": 120, "rows_kept": 117, "dropped": {"duplicate": 2, "nonfinite": 1},
        "splits": {"train": 80, "val": 17, "test": 20},
    }))
    (run_dir / "config.yaml").write_text("name: tiny\nmodel:\n  name: mlp\n  args: {note: '<script>'}\n")
    return run_dir


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', html)]


def test_full_run_has_every_section_and_plot(tmp_path):
    run_dir = _classification_run(tmp_path / "run")
    path = write_report(run_dir)
    assert path == run_dir / "report.html"
    html = path.read_text()

    for section in ("eval", "curves", "confusion", "per-class", "data", "config"):
        assert f'<section id="{section}">' in html
    # loss, val accuracy/macro-F1, lr, throughput, peak memory, confusion matrix
    images = _images(html)
    assert len(images) == html.count("<img") == 6
    assert all(img.startswith(b"\x89PNG") for img in images)
    # tables carry the numbers
    assert "<th>accuracy</th><td class=\"num\">0.75</td>" in html  # eval.json: 3 of 4 right
    assert "<th>duplicate</th><td class=\"num\">2</td>" in html
    assert "<th>test</th><td class=\"num\">20</td>" in html
    # self-contained: no external fetches, no scripts
    assert "http://" not in html and "https://" not in html and "<script" not in html


def test_text_from_run_files_is_escaped(tmp_path):
    html = write_report(_classification_run(tmp_path / "run")).read_text()
    assert "<th>&lt;b&gt;</th>" in html  # per-class row of the class named "<b>"
    assert "<b>" not in html
    assert "&lt;script&gt;" in html and "<script>" not in html  # config.yaml


def test_lm_run_plots_perplexity_and_has_no_classification_sections(tmp_path):
    run_dir = tmp_path / "lm"
    run_dir.mkdir()
    with MetricsLog(run_dir / "metrics.jsonl", None) as log:
        log.log({"split": "train", "step": 1, "epoch": 0, "loss": 5.0, "lr": 3e-4})
        log.log({"split": "val", "step": 1, "epoch": 0, "loss": 4.0, "perplexity": 54.6})
    (run_dir / "eval.json").write_text(json.dumps({"split": "test", "loss": 4.0, "perplexity": 54.6}))
    html = write_report(run_dir).read_text()
    assert html.count("<img") == 3  # loss, perplexity, lr
    assert 'alt="Validation perplexity"' in html
    assert 'id="confusion"' not in html and 'id="per-class"' not in html


def test_missing_files_degrade_to_notes(tmp_path):
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    html = write_report(run_dir).read_text()
    assert html.count("<img") == 0
    for name in ("eval.json", "metrics.jsonl", "data_report.json", "config.yaml"):
        assert f"No {name} in this run." in html


def test_single_row_run_renders(tmp_path):
    run_dir = tmp_path / "short"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps(_train_row(1)) + "\n" + '{"split": "va')  # crashed
    html = write_report(run_dir).read_text()
    assert html.count("<img") == 4  # loss, lr, throughput, memory


def test_unreadable_eval_json_is_a_note_not_a_crash(tmp_path):
    run_dir = _classification_run(tmp_path / "run")
    (run_dir / "eval.json").write_text("{not json")
    with pytest.warns(UserWarning, match="eval.json"):
        html = write_report(run_dir).read_text()
    assert "eval.json could not be read" in html
    assert html.count("<img") == 5  # the curves survive


def test_extra_sections_are_appended(tmp_path):
    run_dir = _classification_run(tmp_path / "run")
    html = write_report(run_dir, extra_sections=[("Compression <v2>", "<table><tr><td>int8</td></tr></table>")]).read_text()
    assert "<h2>Compression &lt;v2&gt;</h2>" in html
    assert "<table><tr><td>int8</td></tr></table>" in html
    assert html.index('id="config"') < html.index('id="extra-0"')


def test_missing_run_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="run directory not found"):
        write_report(tmp_path / "nope")


def test_report_does_not_touch_pyplot_or_the_backend(tmp_path):
    run_dir = _classification_run(tmp_path / "run")
    code = (
        "import sys, matplotlib; matplotlib.use('svg'); "
        "from trainforge.report import write_report; "
        f"write_report({str(run_dir)!r}); "
        "assert 'matplotlib.pyplot' not in sys.modules; "
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_log_report_false_writes_no_report_and_runs_report_writes_it_later(tmp_path, capsys):
    """`log.report: false` ends the run without drawing its charts; `trainforge runs report RUN` writes the same
    report from the run directory alone, and refuses a folder that is not a run with one line and exit 2."""
    import trainforge
    from trainforge.cli import main

    run = trainforge.train(trainforge.load_config(None, [
        "data.source=digits", "model.name=mlp", "model.args={hidden: [16], dropout: 0.0}", "train.max_steps=3",
        "train.global_batch_size=32", "train.micro_batch_size=32", "train.early_stopping=null",
        "log.progress=false", "log.tensorboard=false", "log.report=false"]), run_dir=tmp_path / "run").run_dir
    assert (run / "eval.json").is_file() and not (run / "report.html").exists()
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["runs", "report", str(run)])
    assert done.value.code in (0, None)
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    html = (run / "report.html").read_text()
    assert "Training curves" in html and "Confusion matrix" in html and len(_images(html)) >= 2

    (tmp_path / "not-a-run").mkdir()
    with pytest.raises(SystemExit) as refused:
        main(["runs", "report", str(tmp_path / "not-a-run")])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and "not a run directory" in err and "\n" not in err
    assert list((tmp_path / "not-a-run").iterdir()) == []


def test_a_detection_run_gets_its_pr_curves_and_per_class_ap(tmp_path):
    """eval.json's pr_curves (tasks/detection.py) drawn as one chart; the per-class table shows the statistics the
    classes have (a detector's ap), not classification's columns; a malformed pr_curves is a note."""
    run = tmp_path / "det"
    run.mkdir()
    recall = [i / 100 for i in range(101)]
    ev = {"split": "test", "map": 0.5, "map_50": 0.8, "per_class": {"car": {"ap": 0.6}, "<ped>": {"ap": None}},
          "pr_curves": {"iou": 0.5, "recall": recall, "precision": {"car": [1.0 - r / 2 for r in recall],
                                                                    "<ped>": [None] * 101}}}
    (run / "eval.json").write_text(json.dumps(ev))
    html = write_report(run).read_text()
    assert 'alt="Precision-recall per class, test split (IoU 0.5)"' in html
    table = html[html.index('id="per-class"'):]
    assert "<th>ap</th>" in table and "<th>f1</th>" not in table and "&lt;ped&gt;" in table
    ev["pr_curves"]["precision"]["car"] = [1.0]  # shorter than recall
    (run / "eval.json").write_text(json.dumps(ev))
    assert "pr_curves in eval.json is not a recall list" in write_report(run).read_text()


def test_a_classifier_gets_its_roc_curves_and_a_malformed_one_is_a_note(tmp_path):
    run = tmp_path / "ct"
    run.mkdir()
    ev = {"split": "test", "accuracy": 0.9, "auroc": 0.93,
          "roc_curves": {"sphere": {"fpr": [0.0, 0.1, 1.0], "tpr": [0.0, 0.8, 1.0]}}}
    (run / "eval.json").write_text(json.dumps(ev))
    html = write_report(run).read_text()
    assert 'id="roc-curves"' in html and 'alt="ROC, test split (AUROC 0.930)"' in html
    ev["roc_curves"]["sphere"]["tpr"] = [0.0, "x", 1.0]
    (run / "eval.json").write_text(json.dumps(ev))
    assert "roc_curves in eval.json holds values that are not numbers" in write_report(run).read_text()


def test_the_validation_picture_is_embedded_with_its_step(tmp_path):
    from PIL import Image

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "step": 40, "map": 0.5}) + "\n")
    Image.fromarray(np.zeros((8, 16, 3), np.uint8)).save(run / "val_images.png")
    html = write_report(run).read_text()
    assert 'alt="The first validation images at step 40' in html
    (run / "val_images.png").write_bytes(b"<svg onload=alert(1)>")
    assert "val_images.png is not a PNG." in write_report(run).read_text()
