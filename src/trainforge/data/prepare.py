"""`trainforge data prepare`: a recipe's data made ready once, before any run needs it.

    result = prepare_data(cfg.data, seed=cfg.seed)                 # --format tokens: the token shards
    result = prepare_data(cfg.data, seed=cfg.seed, rebuild=True)   # tokenize again, even if they are ready
    result["tokens"], result["shards"], result["directory"], result["reused"]

Runs also do it on first use (`build_data`), under the same lock: preparing first only moves the work, e.g. to
a CPU node ahead of a multi-GPU job, and shows its progress on its own.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from trainforge.config import DataConfig
from trainforge.data.pipeline import corpus_tokenizer
from trainforge.data.pool import Pool, TextCorpus
from trainforge.data.shards import RawBytes, Subword, prepare_shards, stderr_progress
from trainforge.data.sources import SOURCES
from trainforge.errors import UserError
from trainforge.registry import Registry

Prepare = Callable[..., dict[str, Any]]
FORMATS: Registry[Prepare] = Registry("data format", "--format")


def prepare_data(cfg: DataConfig, *, seed: int, data_format: str = "tokens", rebuild: bool = False,
                 workers: Optional[int] = None) -> dict[str, Any]:
    """The recipe's data in `data_format`, prepared now or found ready; what was written (JSON-able)."""
    return {"format": data_format, **FORMATS.get(data_format)(cfg, seed=seed, rebuild=rebuild, workers=workers)}


@FORMATS.register("tokens")
def token_shards(cfg: DataConfig, *, seed: int, rebuild: bool, workers: Optional[int]) -> dict[str, Any]:
    """A language-modelling corpus (textfile, hf_datasets without a label column) as memory-mapped token shards."""
    if workers is not None and workers < 1:
        raise UserError(f"--workers: must be 1 or more, got {workers}")
    pool = SOURCES.get(cfg.source)(cfg, seed=seed)
    if not isinstance(pool, Pool) or not isinstance(pool.samples, TextCorpus):
        raise UserError(f"data.source: {cfg.source!r} gives no language-modelling corpus; --format tokens prepares "
                        "textfile, or hf_datasets without data.args.label_column", public=True)
    tok = corpus_tokenizer(cfg, pool.samples.corpus, None)
    index = prepare_shards(pool.samples.corpus, RawBytes() if tok is None else Subword.of(tok), rebuild=rebuild,
                           workers=workers, progress=stderr_progress)
    return {"corpus": pool.samples.corpus.origin, "tokenizer": index.tokenizer["kind"], **index.summary()}
