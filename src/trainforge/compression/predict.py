"""Serve an exported artifact: onnxruntime + numpy only, no torch (`trainforge predict`).

    from trainforge.compression.predict import predict
    result = predict("runs/digits/compressed", ["seven.png", "three.png"], top_k=3)
    result["predictions"][0]   # {"input": "seven.png", "label": "7", "index": 7, "probability": 0.98,
                               #  "top": [["7", 0.98], ["1", 0.01], ["9", 0.004]]}

ARTIFACT is an .onnx file written by `trainforge compress`, or the folder it wrote: then the variant its
compress.json marks `recommended` is served (the fastest at batch 32 within the accuracy tolerance, as
measured by compress; `trainforge.compression.recommend`), or the one named by `variant` (--variant).
compress.json and the served file are first checked against the SHA-256 in the folder's manifest.json
(`verify=False`, --no-verify, skips that). The metadata inside the file (`trainforge.compression.artifact`)
says how to turn the inputs into a batch (`trainforge.compression.serving`).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from trainforge.compression.artifact import FILE_NAMES, INPUT_NAME, OUTPUT_NAME, meta_from_session
from trainforge.compression.recommend import ACCURACY_TOLERANCE_PT, recommend, servable
from trainforge.compression.serving import READERS, STDIN, Sample, require_files, text_lines
from trainforge.errors import UserError
from trainforge.integrity import NO_VERIFY, check_files, read_digests
from trainforge.layout import COMPRESS_RECORD
from trainforge.tasks import TASKS

RECORD_FILE = COMPRESS_RECORD
UNVERIFIABLE = f"{NO_VERIFY}, or re-run `trainforge compress`"
RESTORE = "restore it from a good copy or re-run `trainforge compress`"
DTYPES = {"float32": np.float32, "int64": np.int64}


@dataclass
class Artifact:
    path: Path
    session: Any  # onnxruntime.InferenceSession
    meta: dict[str, Any]
    choice: Optional["Choice"] = None  # why this file (None: built by hand)

    @property
    def class_names(self) -> list[str]:
        return [str(c) for c in self.meta.get("class_names") or []]


@dataclass
class Choice:
    """The file a predict call serves, and why."""

    file: Path
    recommended: Optional[str] = None  # the folder's recommended variant (None: ARTIFACT was a file)
    by: str = "file"  # file | recommended | --variant


def resolve_artifact(path: Union[str, Path], variant: Optional[str] = None, verify: bool = True) -> Choice:
    """The .onnx file to serve: `path` itself, or in a compress output folder its recommended variant (or `variant`).

    With `verify`, every file read here (compress.json, then the chosen .onnx) is first checked against the
    folder's manifest, so a swapped record cannot redirect serving and a damaged file is never parsed.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"ARTIFACT: {path} does not exist; pass an .onnx file or a `trainforge compress` output folder")
    if path.is_file():
        if variant is not None:
            raise UserError(f"--variant: chooses among the variants of a compress output folder; {path} is a file: "
                            "pass its folder, or drop --variant")
        if verify:
            check_files(path.parent, read_digests(path.parent, UNVERIFIABLE), [path.name], unverifiable=UNVERIFIABLE,
                        fix=RESTORE)
        return Choice(path)
    if not (path / RECORD_FILE).exists() and not any((path / f).is_file() for f in FILE_NAMES.values()):
        found = sorted(p.name for p in path.glob("*.onnx"))
        hint = f"it has {', '.join(found)}: pass one of them" if found else "point it at a `trainforge compress` output folder"
        raise UserError(f"ARTIFACT: {path} holds none of {', '.join(FILE_NAMES.values())}; {hint}")
    digests = read_digests(path, UNVERIFIABLE) if verify else None
    files, recommended = folder_variants(path, digests)
    if not files:
        raise UserError(f"ARTIFACT: {path / RECORD_FILE} lists no ONNX variant; pass an .onnx file")
    if variant is not None:
        if variant not in files:
            raise UserError(f"--variant: no variant {variant!r} in {path}; valid names: {', '.join(files)}")
        name, by = variant, "--variant"
    elif recommended is not None:
        name, by = recommended, "recommended"
    else:
        raise UserError(f"ARTIFACT: {path} has no {RECORD_FILE} saying which variant to serve; pass --variant NAME "
                        f"(one of {', '.join(files)}) or one of its .onnx files")
    file = path / files[name]
    if digests is not None:
        check_files(path, digests, [file.name], unverifiable=UNVERIFIABLE, fix=RESTORE)
    elif not file.is_file():
        raise UserError(f"ARTIFACT: {file} is missing ({RECORD_FILE} lists it); {RESTORE}")
    return Choice(file, recommended, by)


def folder_variants(folder: Path, digests: Optional[dict[str, str]]) -> tuple[dict[str, str], Optional[str]]:
    """({variant name: file name}, the recommended name) from the folder's compress.json.

    Without compress.json (a folder of hand-placed files): the standard file names present, no recommendation;
    a compress.json the manifest lists but that is gone is an error. A compress.json from before
    recommendations were recorded gets one by the same rule, from its own recorded numbers.
    """
    record = folder / RECORD_FILE
    if digests is not None and (record.exists() or RECORD_FILE in digests):
        check_files(folder, digests, [RECORD_FILE], unverifiable=UNVERIFIABLE, fix="re-run `trainforge compress`")
    if not record.exists():
        return {name: file for name, file in FILE_NAMES.items() if (folder / file).is_file()}, None
    try:
        doc = json.loads(record.read_text())
        rows = [v for v in doc["variants"] if servable(v)]
        files = {str(v["name"]): Path(str(v["path"])).name for v in rows}  # the name only: the folder may have moved
        marked = [str(v["name"]) for v in rows if v.get("recommended") is True]
        if len(marked) > 1:
            raise ValueError("more than one recommended variant")
        if marked:
            return files, marked[0]
        tolerance = (doc.get("recommendation") or {}).get("accuracy_tolerance_pt", ACCURACY_TOLERANCE_PT)
        return files, recommend(doc["variants"], float(tolerance)).name
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise UserError(f"ARTIFACT: {record} is damaged or not a `trainforge compress` record; re-run "
                        "`trainforge compress` or pass one of its .onnx files") from None


GENERATION_NEW_TOKENS = 256


def serve_generation(folder: Path, inputs: Sequence[str], *, stdin: Optional[BinaryIO], verify: bool) -> dict[str, Any]:
    """Answer each non-empty line of the text INPUTs with a causal LM saved by save_pretrained (a run's final/hf):
    greedy, as one user message of its chat template when its tokenizer has one, else as text to continue.
    This path needs torch and transformers (the ONNX path above does not)."""
    # heavy (torch, transformers): only serving a causal LM folder needs them
    from trainforge.training.generate import load_generator

    require_files(inputs, "text files (one prompt a line) or - (standard input)", allow_stdin=True)
    prompts = [line for name in inputs for _, line in text_lines(read_input(name, stdin))]
    if not prompts:
        raise UserError("INPUT: no non-empty line to answer; pass text files with one prompt a line")
    model = load_generator(folder, verify)  # checks the folder (manifest) and that it is a causal LM
    chat = bool(getattr(model.codec, "template", None))
    answers = [model.complete(p, chat=chat, temperature=0.0, max_new_tokens=GENERATION_NEW_TOKENS) for p in prompts]
    return {"artifact": str(folder), "variant": "hf", "recommended": None, "chosen_by": "file", "chat": chat,
            "predictions": [{"input": p, "text": a.text, "new_tokens": a.new_tokens, "stopped": a.stopped}
                            for p, a in zip(prompts, answers)]}


def read_input(name: str, stdin: Optional[BinaryIO]) -> bytes:
    if name == STDIN:
        return (stdin or sys.stdin.buffer).read()
    return Path(name).read_bytes()


def load_artifact(path: Union[str, Path], threads: Optional[int] = None, verify: bool = True,
                  variant: Optional[str] = None) -> Artifact:
    """An onnxruntime CPU session and the trainforge metadata of an artifact file or compress folder."""
    import onnxruntime as ort  # only the commands that serve pay for it

    choice = resolve_artifact(path, variant, verify)
    file = choice.file
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: onnxruntime's warnings would clutter stderr on every call
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1  # one graph at a time: the threads go to the operators
    try:
        session = ort.InferenceSession(str(file), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's errors (InvalidProtobuf, Fail, ...) share no base class but Exception
        raise UserError(f"ARTIFACT: {file} is not a readable ONNX model ({first_line(e)}); export it with `trainforge compress`") from None
    try:
        meta = meta_from_session(session, file)
    except json.JSONDecodeError:
        raise UserError(f"ARTIFACT: {file} has damaged trainforge metadata; re-export it with `trainforge compress`") from None
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if INPUT_NAME not in inputs or OUTPUT_NAME not in outputs:
        raise UserError(
            f"ARTIFACT: {file} has inputs {inputs} and outputs {outputs}; a trainforge artifact has "
            f"{INPUT_NAME!r} -> {OUTPUT_NAME!r}: re-export it with `trainforge compress`"
        )
    task = TASKS.get(meta["task"]) if meta.get("task") in TASKS else None
    if task is None or task.predict_refusal is not None:
        served = ", ".join(n for n in TASKS.names() if TASKS.get(n).predict_refusal is None)
        raise UserError(f"ARTIFACT: predict serves {served} models; {file} is a {meta.get('task')!r} model"
                        + (f" ({task.predict_refusal})" if task is not None else ""))
    if meta.get("modality") not in READERS or meta.get("input_dtype") not in DTYPES:
        raise UserError(
            f"ARTIFACT: {file} takes {meta.get('modality')!r} inputs of {meta.get('input_dtype')!r}; "
            f"predict serves {', '.join(READERS.names())} models with {', '.join(DTYPES)} inputs"
        )
    return Artifact(file, session, meta, choice)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def batches(samples: Iterable[Sample], batch_size: int, dtype: Any) -> Iterator[tuple[list[str], np.ndarray]]:
    """Consecutive groups of at most `batch_size` samples, stacked into one array."""
    names: list[str] = []
    arrays: list[np.ndarray] = []
    for name, x in samples:
        names.append(name)
        arrays.append(x)
        if len(names) == batch_size:
            yield names, np.stack(arrays).astype(dtype, copy=False)
            names, arrays = [], []
    if names:
        yield names, np.stack(arrays).astype(dtype, copy=False)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (shifted by the row maximum, so large logits do not overflow)."""
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def rank(probs: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest probabilities, largest first; ties go to the lower index (like argmax)."""
    return [int(i) for i in np.argsort(-probs, kind="stable")[:k]]


def run_batch(artifact: Artifact, batch: np.ndarray) -> np.ndarray:
    try:
        (logits,) = artifact.session.run([OUTPUT_NAME], {INPUT_NAME: batch})
    except Exception as e:  # the graph disagrees with its own metadata (shape, dtype): a broken artifact
        raise UserError(f"ARTIFACT: onnxruntime cannot run {artifact.path} on a {batch.shape} batch ({first_line(e)}); re-export it") from None
    if logits.ndim != 2 or logits.shape[0] != len(batch):
        raise UserError(f"ARTIFACT: {artifact.path} returned logits of shape {logits.shape}; a classifier returns (batch, classes)")
    return logits


def classify(artifact: Artifact, samples: Iterable[Sample], top_k: int, batch_size: int) -> list[dict[str, Any]]:
    names = artifact.class_names
    predictions = []
    for inputs, batch in batches(samples, batch_size, DTYPES[artifact.meta["input_dtype"]]):
        probs = softmax(run_batch(artifact, batch))
        if names and probs.shape[1] != len(names):
            raise UserError(f"ARTIFACT: {artifact.path} returns {probs.shape[1]} classes but names {len(names)}; re-export it")
        labels = names or [str(i) for i in range(probs.shape[1])]
        for name, p in zip(inputs, probs):
            top = rank(p, top_k)
            predictions.append({
                "input": name,
                "label": labels[top[0]],
                "index": top[0],
                "probability": float(p[top[0]]),
                "top": [[labels[i], float(p[i])] for i in top],
            })
    return predictions


def check_positive(value: Optional[int], option: str) -> None:
    if value is not None and value < 1:
        raise UserError(f"{option}: must be at least 1, got {value}")


def predict(
    artifact: Union[str, Path],
    inputs: Sequence[str],
    *,
    top_k: int = 3,
    batch_size: int = 32,
    threads: Optional[int] = None,
    stdin: Optional[BinaryIO] = None,
    verify: bool = True,
    variant: Optional[str] = None,
) -> dict[str, Any]:
    """Classify `inputs` (image files; text files or '-'; CSV files or '-') with an artifact.

    `verify=False` skips the SHA-256 check against the artifact folder's manifest.json (--no-verify).
    `variant` (--variant) serves that variant of a compress output folder instead of its recommended one.

    Returns {"artifact": the .onnx file served, "variant": its variant name, "recommended": the folder's
    recommended variant (null when ARTIFACT is a file), "chosen_by": "recommended" | "--variant" | "file",
    "predictions": [{"input",
    "label", "index", "probability", "top": [[label, probability], ...]}]}, in input order (a text or CSV
    file contributes one prediction per non-empty line or row). `stdin` replaces sys.stdin for '-'.
    """
    check_positive(top_k, "--top-k")
    check_positive(batch_size, "--batch-size")
    check_positive(threads, "--threads")
    if not inputs:
        raise UserError("INPUT: no inputs given; pass image files, text files, CSV files or - (standard input)")
    if (Path(artifact) / "config.json").is_file():  # a transformers folder (a run's final/hf): a causal LM to serve
        return serve_generation(Path(artifact), inputs, stdin=stdin, verify=verify)
    art = load_artifact(artifact, threads=threads, verify=verify, variant=variant)
    read = READERS.get(art.meta["modality"])(art.meta, str(art.path), stdin)
    predictions = classify(art, read(inputs), top_k, batch_size)
    if not predictions:
        raise UserError(f"INPUT: {', '.join(inputs)} held no inputs (no non-empty lines or data rows); add some")
    choice = art.choice or Choice(art.path)
    return {"artifact": str(art.path), "variant": art.meta.get("variant"), "recommended": choice.recommended,
            "chosen_by": choice.by, "predictions": predictions}
