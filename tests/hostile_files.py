"""Hostile files of issue 40, built by the tests that attack trainforge with them (the command line's:
tests/e2e/test_hostile_files.py; the job server's: tests/jobs/test_jobs_hostile_files.py)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from tiny_models import corpus, save_tiny_llama

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] + '\n' + m['content'] }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'assistant\n' }}{% endif %}")


RAN = "evil.py ran"  # what the folder's code prints when it runs: in a job's or the server's log, the proof


def evil_code(marker: Path) -> str:
    """A custom architecture as a hub repository ships one (auto_map + a .py file): a Llama under another model_type.
    Importing it leaves `marker` where it may write there (a job's fence may not let it), and prints RAN."""
    return ("import pathlib\n"
            f"try:\n    pathlib.Path({str(marker)!r}).write_text('ran')\nexcept OSError:\n    pass\n"
            f"print({RAN!r}, flush=True)\n"
            "from transformers import LlamaConfig, LlamaForCausalLM\n\n\n"
            "class EvilConfig(LlamaConfig):\n    model_type = 'evilllama'\n\n\n"
            "class EvilForCausalLM(LlamaForCausalLM):\n    config_class = EvilConfig\n")


def save_remote_code_model(path: Path, marker: Path, first: str = "") -> Path:
    """A tiny causal LM whose config names classes of its own code: transformers must run evil.py to load it.
    `first`: more code evil.py runs first (what a test wants the job's code to try)."""
    save_tiny_llama(path)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="evilllama", architectures=["EvilForCausalLM"],
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"})
    (path / "config.json").write_text(json.dumps(config))
    (path / "evil.py").write_text(first + evil_code(marker))
    return path


def pickle_payload_bin(path: Path, marker: Path) -> None:
    """A torch.save file whose pickle calls os.system when unpickled without weights_only."""
    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model.embed_tokens.weight": Payload()}, path)


def hostile_index(shards: Path, tmp_path: Path, kind: str) -> Path:
    """A copy of `shards` whose first train shard index is `kind`: a pickle, a 2**40 size, a negative offset."""
    copy = shutil.copytree(shards, tmp_path / f"shards-{kind}")
    index = copy / "train-00000.idx.npy"
    rows = np.load(index)
    if kind == "pickle":
        np.save(index, np.array([{"offset": 0}] * len(rows), dtype=object), allow_pickle=True)
    elif kind == "huge":
        rows[0, 1] = 2**40
        np.save(index, rows)
    elif kind == "negative":
        rows[0, 0] = -4096
        np.save(index, rows)
    elif kind == "vast":  # a header claiming 10**30 rows: numpy cannot even size it
        header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, 3), }" % 10**30
        header += " " * (63 - (len(header) + 10) % 64) + "\n"
        index.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 48)
    elif kind == "samples":  # index.json claims 10**30 samples in the first shard
        doc = json.loads((copy / "index.json").read_text())
        doc["splits"]["train"][0]["samples"] = 10**30
        (copy / "index.json").write_text(json.dumps(doc))
    return copy


WDS = ["data.source=webdataset", "data.args={image_size: 8}", "data.normalize=none", "data.augment.rotation_deg=0",
       "data.augment.crop_scale=null", "model.name=mlp", "model.args={hidden: [8]}"]


def hostile_model_files(root: Path, marker: Path, pwned: Path) -> dict[str, Path]:
    """Under `root`: texts and chats to train on, a good tiny Llama folder, and the hostile ones: `remote` (its code
    leaves `marker`), `pickled` (a pytorch_model.bin whose pickle would leave `pwned`), `truncated` (half a
    model.safetensors), `other` (weights of another model: no tensor name of its config), `badtok` (a tokenizer.json
    that does not parse) and `short` (128 positions, for data of 512 tokens)."""
    from safetensors.torch import load_file, save_file

    out = {"root": root, "marker": marker, "pwned": pwned, "text": root / "docs.txt", "chats": root / "chats.jsonl"}
    out["text"].write_text("\n".join(corpus(300)))
    out["chats"].write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                             {"role": "assistant", "content": f"answer {i}"}]}) + "\n"
                                    for i in range(40)))
    good = out["good"] = save_tiny_llama(root / "good")
    out["remote"] = save_remote_code_model(root / "remote", marker)
    pickled = out["pickled"] = shutil.copytree(good, root / "pickled")
    (pickled / "model.safetensors").unlink()
    pickle_payload_bin(pickled / "pytorch_model.bin", pwned)
    truncated = out["truncated"] = shutil.copytree(good, root / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    other = out["other"] = shutil.copytree(good, root / "other")
    save_file({f"other.{k}": v for k, v in load_file(str(other / "model.safetensors")).items()},
              str(other / "model.safetensors"))
    badtok = out["badtok"] = shutil.copytree(good, root / "badtok")
    (badtok / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    out["short"] = save_tiny_llama(root / "short", chat_template=CHAT_TEMPLATE, max_position_embeddings=128)
    return out
