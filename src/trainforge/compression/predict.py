"""Serve an exported artifact: onnxruntime + numpy only, no torch (`trainforge predict`).

    from trainforge.compression.predict import predict
    result = predict("runs/digits/compressed", ["seven.png", "three.png"], top_k=3)
    result["predictions"][0]   # {"input": "seven.png", "label": "7", "index": 7, "probability": 0.98,
                               #  "top": [["7", 0.98], ["1", 0.01], ["9", 0.004]]}

ARTIFACT is an .onnx file written by `trainforge compress`, or the folder it wrote: then the most
compressed variant there is served, in the order of `VARIANT_FILES`. The file is first checked against
the SHA-256 in its folder's manifest.json (`verify=False`, --no-verify, skips that). The metadata inside
the file (`trainforge.compression.artifact`) says how to turn the inputs into a batch
(`trainforge.compression.serving`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from trainforge.compression.artifact import INPUT_NAME, OUTPUT_NAME, meta_from_session
from trainforge.compression.serving import READERS, Sample
from trainforge.errors import UserError
from trainforge.integrity import NO_VERIFY, check_files, read_digests

# A compress output folder is served by its smallest, fastest variant first; pass a file to choose another.
VARIANT_FILES = ("pruned-int8.onnx", "int8.onnx", "pruned.onnx", "fp32.onnx")
DTYPES = {"float32": np.float32, "int64": np.int64}


@dataclass
class Artifact:
    path: Path
    session: Any  # onnxruntime.InferenceSession
    meta: dict[str, Any]

    @property
    def class_names(self) -> list[str]:
        return [str(c) for c in self.meta.get("class_names") or []]


def resolve_artifact(path: Union[str, Path]) -> Path:
    """The .onnx file to serve: `path` itself, or the first of VARIANT_FILES in a compress output folder."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"ARTIFACT: {path} does not exist; pass an .onnx file or a `trainforge compress` output folder")
    if path.is_file():
        return path
    for name in VARIANT_FILES:
        if (path / name).is_file():
            return path / name
    found = sorted(p.name for p in path.glob("*.onnx"))
    hint = f"it has {', '.join(found)}: pass one of them" if found else "point it at a `trainforge compress` output folder"
    raise UserError(f"ARTIFACT: {path} holds none of {', '.join(VARIANT_FILES)}; {hint}")


def verify_artifact(file: Path, from_folder: bool) -> None:
    """`file` against the SHA-256 its folder's manifest records, before onnxruntime parses a byte of it.

    Served from a folder, every variant preferred over `file` that the manifest lists must be there too:
    a deleted int8.onnx must not quietly put fp32.onnx into service.
    """
    unverifiable = f"{NO_VERIFY}, or re-run `trainforge compress`"
    digests = read_digests(file.parent, unverifiable)
    names = [file.name]
    if from_folder:
        names = [n for n in VARIANT_FILES[:VARIANT_FILES.index(file.name)] if n in digests] + names
    check_files(file.parent, digests, names, unverifiable=unverifiable,
                fix="restore it from a good copy or re-run `trainforge compress`")


def load_artifact(path: Union[str, Path], threads: Optional[int] = None, verify: bool = True) -> Artifact:
    """An onnxruntime CPU session and the trainforge metadata of an artifact file or compress folder."""
    import onnxruntime as ort  # only the commands that serve pay for it

    file = resolve_artifact(path)
    if verify:
        verify_artifact(file, from_folder=Path(path).is_dir())
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
    if meta.get("task") != "classification":
        raise UserError(
            f"ARTIFACT: predict serves classification models; {file} is a {meta.get('task')!r} model "
            "(a language model: sample from it with the checkpoint instead)"
        )
    if meta.get("modality") not in READERS or meta.get("input_dtype") not in DTYPES:
        raise UserError(
            f"ARTIFACT: {file} takes {meta.get('modality')!r} inputs of {meta.get('input_dtype')!r}; "
            f"predict serves {', '.join(READERS.names())} models with {', '.join(DTYPES)} inputs"
        )
    return Artifact(file, session, meta)


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
) -> dict[str, Any]:
    """Classify `inputs` (image files; text files or '-'; CSV files or '-') with an artifact.

    `verify=False` skips the SHA-256 check against the artifact folder's manifest.json (--no-verify).

    Returns {"artifact": the .onnx file served, "variant": its variant name, "predictions": [{"input",
    "label", "index", "probability", "top": [[label, probability], ...]}]}, in input order (a text or CSV
    file contributes one prediction per non-empty line or row). `stdin` replaces sys.stdin for '-'.
    """
    check_positive(top_k, "--top-k")
    check_positive(batch_size, "--batch-size")
    check_positive(threads, "--threads")
    if not inputs:
        raise UserError("INPUT: no inputs given; pass image files, text files, CSV files or - (standard input)")
    art = load_artifact(artifact, threads=threads, verify=verify)
    read = READERS.get(art.meta["modality"])(art.meta, str(art.path), stdin)
    predictions = classify(art, read(inputs), top_k, batch_size)
    if not predictions:
        raise UserError(f"INPUT: {', '.join(inputs)} held no inputs (no non-empty lines or data rows); add some")
    return {"artifact": str(art.path), "variant": art.meta.get("variant"), "predictions": predictions}
