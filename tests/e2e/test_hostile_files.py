"""Files that someone else made (issue 40), through the real command line: a model folder whose classes are its own
code, a pickle in a weights file, a truncated safetensors file, a tokenizer that does not parse, shard indexes that
are not what trainforge writes, and a sequence length beyond the model's positions. Each is one line and exit 2
before any training step, with nothing run and no traceback; the model folder's code runs only after the recipe
opts in, with one warning. The hostile files are built here. (The same files against the job server:
tests/jobs/test_jobs_hostile_files.py.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostile_files import WDS, hostile_index, hostile_model_files

QUICK = ["train.max_steps=2", "train.global_batch_size=4", "train.micro_batch_size=4", "train.eval_every_steps=2",
         "train.early_stopping=null", "schedule.warmup_steps=0", "data.num_workers=0", "train.device=cpu",
         "log.progress=false", "log.tensorboard=false", "log.report=false"]
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    return hostile_model_files(root, root / "evil-ran", root / "pickle-ran")


def run(args: list[str], tmp_path: Path, stdin: str = "") -> subprocess.CompletedProcess:
    """The installed command line, as a wrapper script would run it (`yes |` piped in: any prompt is answered)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    return subprocess.run([sys.executable, "-m", "trainforge", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)


def lm(files: dict, model: Path, *extra: str) -> list[str]:
    return ["train", "causal_lm_finetune", f"data.path={files['text']}", f"model.args.pretrained={model}",
            "data.args.block_size=32", "data.val_fraction=0.1", "data.test_fraction=0.1", *QUICK, *extra]


PROGRESS = ("token shards: ",)  # what the data stage says while it works, before a model is looked at


def assert_one_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2 and one error line, the last one, with nothing but the data stage's progress before it."""
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, err[-3000:])
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(PROGRESS)]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1] == lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.slow
def test_a_model_folders_own_code_runs_only_after_the_recipe_opts_in(files, tmp_path):
    marker = files["marker"]
    refused = run([*lm(files, files["remote"]), "--run-dir", str(tmp_path / "refused")], tmp_path, stdin="y\n" * 50)
    line = assert_one_line(refused, "model.args.pretrained", "own code", "evil.py", "model.args.trust_remote_code: true")
    assert "trust_remote_code" in line and not marker.exists() and not (tmp_path / "refused").exists()
    generated = run(["generate", str(files["remote"]), "hello", "--max-new-tokens", "2"], tmp_path, stdin="y\n" * 50)
    assert_one_line(generated, "own code", "evil.py")
    assert not marker.exists()

    opted = run([*lm(files, files["remote"], "model.args.trust_remote_code=true"), "--run-dir", str(tmp_path / "ok")],
                tmp_path)
    assert opted.returncode == 0, opted.stderr[-3000:]
    warnings = [line for line in opted.stderr.splitlines() if "model.args.trust_remote_code" in line]
    assert len(warnings) == 1 and str(files["remote"] / "evil.py") in warnings[0], opted.stderr[-3000:]
    assert marker.read_text() == "ran" and (tmp_path / "ok" / "final").is_dir()
    marker.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("folder, says", [
    ("pickled", "pytorch_model.bin is a pickle that holds more than tensors"),
    ("truncated", "model.safetensors is a damaged or truncated safetensors file"),
    ("badtok", "holds no transformers tokenizer"),
    ("other", "weights do not fit its config"),
])
def test_a_bad_weights_or_tokenizer_file_is_one_line_and_runs_nothing(files, tmp_path, folder, says):
    result = run([*lm(files, files[folder]), "--run-dir", str(tmp_path / "run")], tmp_path)
    assert_one_line(result, says)
    assert not files["pwned"].exists() and not (tmp_path / "run").exists()


def test_generate_refuses_a_pickle_and_a_truncated_file_in_one_line(files, tmp_path, capsys):
    from trainforge.cli import main

    for folder, says in (("pickled", "a pickle that holds more than tensors"),
                         ("truncated", "a damaged or truncated safetensors file")):
        with pytest.raises(SystemExit) as exit_:
            main(["generate", str(files[folder]), "hello", "--max-new-tokens", "2"])
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and len(err.splitlines()) == 1 and says in err, err[-2000:]
    assert not files["pwned"].exists()


def test_predict_on_a_folder_with_its_own_code_names_predict(files, tmp_path, capsys):
    """Issue 50, Low: the refusal names the command the user ran, not `trainforge generate`."""
    from trainforge.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    with pytest.raises(SystemExit) as exit_:
        main(["predict", str(files["remote"]), str(prompts)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err[-2000:]
    assert "in `trainforge predict`" in err and "trainforge generate" not in err, err
    assert not files["marker"].exists()


@pytest.mark.slow
def test_a_sequence_longer_than_the_models_positions_is_one_line_before_any_step(files, tmp_path):
    args = ["train", "llm_lora_sft", f"data.path={files['chats']}", f"model.args.pretrained={files['short']}",
            "data.args.seq_len=512", *QUICK, "--run-dir", str(tmp_path / "run")]
    assert_one_line(run(args, tmp_path), "512 tokens", "128 positions", "max_position_embeddings")
    assert not (tmp_path / "run").exists()  # refused by the pre-flight: no run directory, no step


# ---------------------------------------------------------------------------------------------- shard indexes

@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """WebDataset shards of a small image folder, as `trainforge data prepare --format webdataset` writes them."""
    from PIL import Image

    root = tmp_path_factory.mktemp("wds")
    for i in range(16):
        folder = root / "images" / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i * 10, 0, 0)).save(folder / f"{i}.png")
    done = subprocess.run([sys.executable, "-m", "trainforge", "data", "prepare", "digits_cnn", "data.source=imagefolder",
                           f"data.path={root / 'images'}", "--format", "webdataset", "--out", str(root / "shards")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "shards"


@pytest.mark.parametrize("kind, says", [("pickle", "a pickle (object dtype), never unpickled"),
                                        ("huge", "reaches past the end of its tar"),
                                        ("negative", "a negative offset or size"),
                                        ("vast", "too large"),  # issue 50: a header of 10**30 rows
                                        ("samples", "")])  # issue 50: index.json claiming 10**30 samples
def test_a_shard_index_that_trainforge_did_not_write_is_one_line(shards, tmp_path, capsys, kind, says):
    from trainforge.cli import main

    bad = hostile_index(shards, tmp_path, kind)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "digits_cnn", f"data.path={bad}", *WDS, *QUICK, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err[-3000:]
    if kind == "samples":
        assert "index.json lists a shard that is not train-00000.tar" in err, err
    else:
        assert "train-00000.idx.npy is not a shard index trainforge writes" in err and says in err, err
    assert not (tmp_path / "run").exists()


def test_tar_shards_check_every_index_they_read(shards, tmp_path):
    """The reader itself (what a DataLoader worker calls) refuses an index swapped in after the run's start."""
    from trainforge.data.formats.tar_shards import TarShards
    from trainforge.errors import UserError

    good = TarShards.open(shards)
    good.check()
    assert good.read(0)[1] in (0, 1)
    for kind in ("pickle", "huge", "negative"):
        tars = TarShards.open(hostile_index(shards, tmp_path, kind))
        with pytest.raises(UserError, match="is not a shard index trainforge writes"):
            tars.read(0)


def test_an_index_json_with_fields_of_another_type_is_one_line(shards, tmp_path):
    from trainforge.data.formats.tar_shards import read_index
    from trainforge.errors import UserError

    for field, value in (("classes", 3), ("report", {"rows_read": "many"}), ("prepared_with", None)):
        copy = shutil.copytree(shards, tmp_path / f"index-{field}")
        doc = json.loads((copy / "index.json").read_text())
        doc[field] = value
        (copy / "index.json").write_text(json.dumps(doc))
        with pytest.raises(UserError, match=f"is not an index trainforge writes \\({field}"):
            read_index(copy)
