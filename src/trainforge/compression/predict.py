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

from trainforge.compression.artifact import FILE_NAMES, graph_input_names, input_specs, meta_from_session, output_names
from trainforge.compression.recommend import ACCURACY_TOLERANCE_PT, recommend, servable
from trainforge.compression.serving import (ARRAY_SUFFIXES, STDIN, array_samples, modality_reader, own_suffixes,
                                            reads_arrays, serves_files)
from trainforge.data.modalities.inputs import require_files, text_lines
from trainforge.errors import UserError
from trainforge.imports import import_module, where
from trainforge.integrity import NO_VERIFY, check_files, read_digests
from trainforge.layout import COMPRESS_RECORD
from trainforge.tasks import TASKS, Task
from trainforge.tasks.classification import rank, softmax  # noqa: F401  (predict's own helpers once; tests use them)

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
    task: Optional[Task] = None  # the task that serves it (None: built by hand; load_artifact sets it)

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
        recorded = doc.get("recommendation") or {}
        tolerance = recorded.get("accuracy_tolerance_pt", ACCURACY_TOLERANCE_PT)
        return files, recommend(doc["variants"], float(tolerance), str(recorded.get("points", "accuracy")),
                                str(recorded.get("batch", "b32"))).name
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
    model = load_generator(folder, verify, command="trainforge predict")  # checks the folder (manifest) and that it is a causal LM
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
    specs, graph, wanted = input_specs(meta), graph_input_names(meta), output_names(meta)
    if inputs != graph or outputs != wanted:
        raise UserError(
            f"ARTIFACT: {file} has inputs {inputs} and outputs {outputs}; its trainforge metadata says "
            f"{graph} -> {wanted}: re-export it with `trainforge compress`"
        )
    task = served_task(meta, file)
    if any(i.get("dtype") not in DTYPES for i in specs):
        raise UserError(f"ARTIFACT: {file} takes inputs of {sorted({str(i.get('dtype')) for i in specs})}; predict "
                        f"serves models with {', '.join(DTYPES)} inputs")
    return Artifact(file, session, meta, choice, task)


def served_task(meta: dict[str, Any], file: Path) -> Task:
    """The registered task an artifact was exported for. One that is not shipped is served once the user imports
    the module that registers it (--import); predict never imports a module because an artifact names it."""
    name = meta.get("task")
    served = ", ".join(n for n in TASKS.names() if TASKS.get(n).predict_refusal is None)
    if name not in TASKS:
        module = meta.get("task_module")
        hint = (f"it is defined in module {module!r}: pass --import {module} if you trust that code" if module
                else "pass --import MODULE naming the module that registers it")
        raise UserError(f"ARTIFACT: {file} is a {name!r} model, a task not registered here; {hint} (predict serves "
                        f"{served} models)")
    task = TASKS.get(name)
    if task.predict_refusal is not None:
        raise UserError(f"ARTIFACT: predict serves {served} models; {file} is a {name!r} model ({task.predict_refusal})")
    return task


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


WHERE = "__where__"  # a sample's key for where it came from (an image's fit into the model's input), not a feed


def batches(samples: Iterable[tuple[str, dict[str, Any]]], batch_size: int, dtypes: dict[str, Any]
            ) -> Iterator[tuple[list[str], dict[str, np.ndarray], list[dict[str, Any]]]]:
    """Consecutive groups of at most `batch_size` samples of the same shapes, each input stacked into one array, and
    each sample's WHERE ({} when its reader says nothing)."""
    names: list[str] = []
    group: list[dict[str, Any]] = []

    def stacked() -> tuple[list[str], dict[str, np.ndarray], list[dict[str, Any]]]:
        return (names, {k: np.stack([g[k] for g in group]).astype(dtypes[k], copy=False) for k in dtypes},
                [g.get(WHERE) or {} for g in group])

    for name, x in samples:
        if group and (len(names) == batch_size or any(x[k].shape != group[0][k].shape for k in dtypes)):
            yield stacked()
            names, group = [], []
        names.append(name)
        group.append(x)
    if names:
        yield stacked()


def run_feeds(artifact: Artifact, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One onnxruntime call: {output name: array}."""
    names = output_names(artifact.meta)
    try:
        values = artifact.session.run(names, feeds)
    except Exception as e:  # the graph disagrees with its own metadata (shape, dtype): a broken artifact or input
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        raise UserError(f"ARTIFACT: onnxruntime cannot run {artifact.path} on a batch of {shapes} ({first_line(e)}); "
                        "check the inputs' shapes against the model's, or re-export it") from None
    return dict(zip(names, values))


def run_batch(artifact: Artifact, batch: Union[np.ndarray, dict[str, np.ndarray]]) -> Any:
    """The model's output on one batch (an array for a model of one input, else {input name: array}), served as
    predict serves it: the one output of a model that has one, else {output name: array}. MLflow's model of the
    ONNX variant (tracking/pyfunc_onnx.py) predicts through this."""
    specs = input_specs(artifact.meta)
    feeds = batch if isinstance(batch, dict) else {str(specs[0]["name"]): batch}
    dtypes = {str(i["name"]): DTYPES[str(i["dtype"])] for i in specs}
    if set(feeds) != set(dtypes):
        raise UserError(f"ARTIFACT: {artifact.path} takes {', '.join(dtypes)}; got {', '.join(map(str, feeds)) or 'nothing'}")
    feeds = {k: np.ascontiguousarray(np.asarray(v), dtype=dtypes[k]) for k, v in feeds.items()}
    task = artifact.task or served_task(artifact.meta, artifact.path)
    outputs = task.serve(lambda f: run_feeds(artifact, f), feeds, artifact.meta)
    return next(iter(outputs.values())) if len(outputs) == 1 else outputs


def samples_of(artifact: Artifact, inputs: Sequence[str], stdin: Optional[BinaryIO]) -> Iterable[tuple[str, dict[str, np.ndarray]]]:
    """The INPUTs as samples ({input name: array}): arrays (.npz, .npy) for any model; otherwise the reader of the
    modality of a model's one input (images, text lines, CSV rows, point clouds: whose .npy files are its own)."""
    specs = input_specs(artifact.meta)
    own = own_suffixes(artifact.meta.get("modality")) if len(specs) == 1 else ()
    arrays = tuple(s for s in ARRAY_SUFFIXES if s not in own)  # a point cloud's .npy is its modality's file
    if reads_arrays(inputs) and not (own and all(name.lower().endswith(own) for name in inputs)):
        return array_samples(inputs, specs)
    described = ", ".join(f"{i['name']} ({'x'.join(map(str, i['shape']))} {i['dtype']})" for i in specs)
    if len(specs) != 1 or not serves_files(artifact.meta.get("modality")):
        raise UserError(f"INPUT: this model takes {described}: pass {' or '.join(ARRAY_SUFFIXES)} files holding "
                        "an array of each name (numpy.savez), one sample or a batch along axis 0")
    if any(name.lower().endswith(arrays) for name in inputs):
        raise UserError(f"INPUT: pass either arrays ({', '.join(arrays)}) or {artifact.meta['modality']} "
                        "inputs, not both in one call")
    key = str(specs[0]["name"])
    read = modality_reader(artifact.meta, str(artifact.path), stdin)
    return ((item[0], {key: item[1], WHERE: item[2] if len(item) > 2 else {}}) for item in read(inputs))


def infer(artifact: Artifact, samples: Iterable[tuple[str, dict[str, np.ndarray]]], top_k: int,
          batch_size: int, images: Optional[Path] = None, inputs: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Each sample's prediction, as the artifact's task reports it (classification: label, probability, top), in
    the pixels of the file it was read from where a reader fitted it to the model (`fits` in the task's meta); with
    `images`, the task's picture of each prediction that has one, written there (its path under "image"), named
    after its input file (`street.jpg` -> `street.png`)."""
    task = artifact.task or served_task(artifact.meta, artifact.path)
    dtypes = {str(i["name"]): DTYPES[str(i["dtype"])] for i in input_specs(artifact.meta)}
    predictions: list[dict[str, Any]] = []
    names_of, files = picture_names(list(inputs)), set(inputs)
    for names, feeds, wheres in batches(samples, batch_size, dtypes):
        # where each image came from (its fit into the model's input): the task answers in the file's pixels
        meta = {**artifact.meta, "fits": [w.get("fit") for w in wheres]} if any(wheres) else artifact.meta
        outputs = task_call(task, "serve", lambda: task.serve(lambda f: run_feeds(artifact, f), feeds, artifact.meta))
        rows = task_call(task, "predictions", lambda: task.predictions(outputs, meta, top_k=top_k))
        for i, (name, row) in enumerate(zip(names, rows)):
            prediction = {"input": name, **row}
            if images is not None:
                one_in, one_out = {k: v[i] for k, v in feeds.items()}, {k: v[i] for k, v in outputs.items()}
                one_meta = {**artifact.meta, "fit": wheres[i]["fit"]} if wheres[i].get("fit") else artifact.meta
                picture = task_call(task, "prediction_image",
                                    lambda: task.prediction_image(one_in, one_out, row, one_meta))
                if picture is not None:
                    # an input file's picture is named after it; a text line's or an array's by its number
                    file = names_of(name, len(predictions)) if name in files else f"{len(predictions):05d}.png"
                    prediction["image"] = str(save_picture(picture, images / file))
            predictions.append(prediction)
    return predictions


def picture_names(names: list[str]) -> Any:
    """A picture's file name after its input: `street.jpg` -> `street.png`; where two inputs share a name, their
    folders are kept in it (`a/street.jpg` -> `a_street.png`). Without the names up front: the stem, then a number."""
    taken: set[str] = set()

    def stem_of(name: str) -> str:  # ct0.nii.gz -> ct0
        base = Path(name).name
        return Path(base[:-3] if base.lower().endswith(".gz") else base).stem

    stems = [stem_of(n) for n in names]

    def name_of(name: str, index: int) -> str:
        path = Path(name)
        stem = stem_of(name)
        if stems.count(stem) > 1 or stem in taken:
            stem = "_".join([*[p for p in path.parent.parts if p not in ("/", ".", "..")], stem]) or stem
        while stem in taken:
            stem = f"{stem}-{index}"
        taken.add(stem)
        return f"{stem}.png"

    return name_of


def task_call(task: Task, what: str, call: Any) -> Any:
    """`call()`, a step of the task's serving; a task's own code (a module --import loaded) that fails is one line
    saying where, not a traceback."""
    try:
        return call()
    except UserError:
        raise
    except Exception as e:  # a task's code may fail in any way on inputs it did not expect
        raise UserError(f"ARTIFACT: its task {task.name!r} ({type(task).__module__}) failed in {what}: "
                        f"{where(e)}") from None


def check_images_dir(images: Optional[Path]) -> None:
    """--images: a new or empty folder (nothing the user has is overwritten)."""
    if images is None:
        return
    if images.exists() and (not images.is_dir() or any(images.iterdir())):
        raise UserError(f"--images: {images} {'is a file' if not images.is_dir() else 'is not empty'}; name a new "
                        "or empty folder")


def save_picture(picture: np.ndarray, path: Path) -> Path:
    from PIL import Image  # Pillow: predict reads images with it already

    if picture.dtype != np.uint8 or picture.ndim != 3 or picture.shape[2] != 3:
        raise UserError(f"ARTIFACT: its task drew a {picture.dtype} picture of shape {list(picture.shape)}; a picture "
                        "is (height, width, 3) uint8")
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(picture, mode="RGB").save(path)
    return path


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
    imports: Sequence[str] = (),
    images: Optional[Union[str, Path]] = None,
) -> dict[str, Any]:
    """Predict `inputs` (image files; text files or '-'; CSV files or '-'; .npz/.npy arrays) with an artifact.

    `verify=False` skips the SHA-256 check against the artifact folder's manifest.json (--no-verify).
    `variant` (--variant) serves that variant of a compress output folder instead of its recommended one.
    `imports` (--import): modules to import first, e.g. the user's own module that registers the model's task.
    `images` (--images): a new or empty folder for the task's picture of each prediction, where the task draws one
    (a detector's boxes on its image); each such prediction names its file under "image".

    Returns {"artifact": the .onnx file served, "variant": its variant name, "recommended": the folder's
    recommended variant (null when ARTIFACT is a file), "chosen_by": "recommended" | "--variant" | "file",
    "task": the model's task, "predictions": [{"input", and what the task reports: classification's
    "label", "index", "probability", "top": [[label, probability], ...]}]}, in input order (a text or CSV
    file contributes one prediction per non-empty line or row, an array file one per sample). `stdin` replaces
    sys.stdin for '-'.
    """
    check_positive(top_k, "--top-k")
    check_positive(batch_size, "--batch-size")
    check_positive(threads, "--threads")
    if not inputs:
        raise UserError("INPUT: no inputs given; pass image files, text files, CSV files or - (standard input)")
    for module in imports:
        import_module(module, "--import")
    if (Path(artifact) / "config.json").is_file():  # a transformers folder (a run's final/hf): a causal LM to serve
        return serve_generation(Path(artifact), inputs, stdin=stdin, verify=verify)
    art = load_artifact(artifact, threads=threads, verify=verify, variant=variant)
    pictures = None if images is None else Path(images)
    check_images_dir(pictures)
    predictions = infer(art, samples_of(art, inputs, stdin), top_k, batch_size, pictures, inputs)
    if not predictions:
        raise UserError(f"INPUT: {', '.join(inputs)} held no inputs (no non-empty lines or data rows); add some")
    choice = art.choice or Choice(art.path)
    return {"artifact": str(art.path), "variant": art.meta.get("variant"), "recommended": choice.recommended,
            "chosen_by": choice.by, "task": art.meta.get("task"), "predictions": predictions}
