"""Text generation from a trained causal language model: `trainforge generate`.

    trainforge generate runs/causal_lm_finetune-.../ "Once upon a time" --max-new-tokens 64
    trainforge generate runs/chat-.../final "What is LoRA?" --chat --temperature 0 --json
    trainforge.training.generate.generate("runs/lm", "def main(", temperature=0, on_text=print)

The path is anything `trainforge eval` takes (a run directory, its final/, a checkpoints/step-* directory),
loaded by the same `load_trained`. The text is encoded with the run's own stored tokenizer (never a download):
a subword tokenizer rebuilt as a transformers `PreTrainedTokenizerFast` from the files kept in the run's
preprocessing record, or the byte rules for `raw_bytes` runs (`codec_for` of `trainforge.data.text`). A plain
prompt is encoded the way the run's training text was (`TextTokenizer.encode_stream`: no special tokens), so
generation continues it as it would continue a document. `--chat` renders the prompt as one user message with the
run's chat template (the one a `data.source: chat` run trained with, else the tokenizer's own) and its generation
prompt, and stops at the end of the assistant's turn: the template's end-of-turn token, or its end-of-turn text
(e.g. `<|im_end|>` in a tokenizer that lacks it as a token), which is then left out of the text. A tokenizer without
a chat template is an error rather than a fallback to chatml: a model never trained on a template does not follow
it.

Models: `model.name: hf` causal LMs generate with transformers' own `generate` (KV cache); the zoo's `gpt`
with a short loop here (it has no KV cache: each step reruns the last block_size tokens). Sampling is
temperature then nucleus (top-p) only, nothing from the model's generation_config (top-k, repetition penalty)
sneaks in; temperature 0 is greedy. The same seed gives the same text. CUDA (or another accelerator) when
present, else the CPU; fp32 weights throughout.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from trainforge.data.text import Codec, codec_for
from trainforge.errors import UserError
from trainforge.hardware.device import resolve_device
from trainforge.training.artifacts import Trained, load_trained
from trainforge.layout import META, SAMPLES
from trainforge.training.sampling import MAX_NEW_TOKENS, SEED, TEMPERATURE, TOP_P, check_settings  # noqa: F401
from trainforge.tasks import task_of

MODELS = ("hf", "gpt")  # model.name values generate supports


@dataclass(frozen=True)
class GenerateResult:
    prompt: str
    text: str  # the generated text only (the prompt not repeated): exactly the pieces given to on_text, joined
    new_tokens: int
    stopped: str  # "eos" (an end-of-text or end-of-turn token) | "max_new_tokens"
    seconds: float  # generation only, not loading
    tokens_per_s: float
    source: str  # the final/ or checkpoint directory the weights came from
    token_ids: list[int] = field(repr=False)  # the new tokens' ids, the stop token included
    notes: list[str] = field(default_factory=list)  # what was adjusted (e.g. max_new_tokens cut to the context)

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "text": self.text, "new_tokens": self.new_tokens, "stopped": self.stopped,
                "seconds": self.seconds, "tokens_per_s": self.tokens_per_s, "source": self.source,
                "notes": self.notes}


def generate(
    path: str | Path,
    prompt: str,
    *,
    chat: bool = False,
    max_new_tokens: int = MAX_NEW_TOKENS,
    temperature: float = TEMPERATURE,
    top_p: float = TOP_P,
    seed: int = SEED,
    on_text: Optional[Callable[[str], None]] = None,
    verify: bool = True,
) -> GenerateResult:
    """Continue `prompt` (or answer it, with `chat`) with the model of a run dir / final/ / checkpoints/step-*, or
    of a folder save_pretrained wrote (a run's final/hf: transformers alone, the base not needed).

    `on_text` receives the generated text piece by piece as it is produced (whole characters only).
    """
    check_settings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    return load_generator(path, verify).complete(prompt, chat=chat, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, top_p=top_p, seed=seed, on_text=on_text)


@dataclass
class Generator:
    """A loaded causal LM with its tokenizer: `complete` as many prompts as wanted (`trainforge predict` serves
    final/hf this way)."""

    model: nn.Module
    codec: Codec
    name: str  # hf | gpt
    source: str
    vocab_size: Optional[int]
    device: torch.device

    def complete(self, prompt: str, *, chat: bool = False, max_new_tokens: int = MAX_NEW_TOKENS,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P, seed: int = SEED,
                 on_text: Optional[Callable[[str], None]] = None) -> GenerateResult:
        codec, device = self.codec, self.device
        ids, stops, stop_text = codec.chat(prompt) if chat else (codec.encode(prompt), (), None)
        if not ids:
            ids = codec.start_ids()
        stops = tuple(dict.fromkeys([*codec.eos_ids, *stops]))
        out = Detokenizer(codec.decode, on_text, stop_text)
        notes: list[str] = []
        started = time.perf_counter()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the caller's RNG untouched
            torch.manual_seed(seed)
            if self.name == "hf":
                new = _generate_hf(self.model, ids, device=device, max_new_tokens=max_new_tokens,
                                   temperature=temperature, top_p=top_p, stops=stops, pad_id=codec.pad_id,
                                   streamer_for=out, notes=notes)
            else:
                generator = torch.Generator(device=device).manual_seed(seed)
                new = _generate_gpt(self.model, ids, device=device, max_new_tokens=max_new_tokens,
                                    temperature=temperature, top_p=top_p, stops=stops, vocab_size=self.vocab_size,
                                    generator=generator, detokenizer=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        text = out.finish()
        return GenerateResult(prompt=prompt, text=text, new_tokens=len(new),
                              stopped="eos" if out.stopped or (new and new[-1] in stops) else "max_new_tokens",
                              seconds=seconds, tokens_per_s=len(new) / seconds if seconds > 0 else 0.0,
                              source=self.source, token_ids=new, notes=notes)


def load_generator(path: str | Path, verify: bool = True, device: Optional[str] = None,
                   command: str = "trainforge generate") -> Generator:
    """`device`: train.device's values (default: the run's own train.device; `auto` for a transformers folder)."""
    if is_transformers_folder(path):  # final/hf (or any save_pretrained folder): transformers alone, no base needed
        model, preprocess, name, source = load_transformers_folder(Path(path), verify, command)
        vocab, run_device = None, "auto"
    else:
        trained = load_trained(path, verify=verify)
        check_causal_lm(trained)
        model, preprocess = trained.build_model(), trained.preprocess
        name, source, vocab = trained.config.model.name, str(trained.source), trained.info.vocab_size
        run_device = trained.config.train.device
    device = resolve_device(device or run_device)
    codec = codec_for(preprocess)
    return Generator(model.to(device).eval(), codec, name, source, codec.vocab_size or vocab, device)


TOKENIZER_SUFFIXES = (".json", ".jinja", ".txt", ".model")  # what save_pretrained writes for a tokenizer


def is_transformers_folder(path: str | Path) -> bool:
    """A folder save_pretrained wrote (config.json, no trainforge model.json): a run's final/hf, say."""
    path = Path(path)
    return (path / "config.json").is_file() and not (path / META).is_file()


def load_transformers_folder(path: Path, verify: bool, command: str = "trainforge generate"
                             ) -> tuple[nn.Module, dict[str, Any], str, str]:
    """(model, a preprocessing record holding the folder's tokenizer files, "hf", source) of a causal LM folder,
    checked against its manifest when it has one (a run's final/hf has)."""
    # heavy (transformers): only generation from such a folder needs it
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainforge.hub import load_weights_safely, needs_remote_code, remote_code_files, remote_code_refusal
    from trainforge.integrity import MANIFEST_FILE, check_files, read_digests
    from trainforge.models.hf import HFModel, no_progress_bars

    files = sorted(p for p in path.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    if verify and (path / MANIFEST_FILE).is_file():
        check_files(path, read_digests(path, "pass --no-verify"), [p.name for p in files],
                    fix="restore the folder from a good copy", unverifiable="pass --no-verify")
    try:  # a folder whose classes are its own code (auto_map) is refused: generate never runs a folder's code
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        if needs_remote_code(e):
            raise remote_code_refusal(str(path), "PATH", remote_code_files(path),
                                      opt_in=f"in `{command}`; load it with transformers yourself if you "
                                             "trust it") from None
        raise UserError(f"{path}: not a readable transformers folder ({str(e).splitlines()[0][:160]})") from None
    if not any(a.endswith("ForCausalLM") for a in (config.architectures or [])):
        raise UserError(f"{path}: a {', '.join(config.architectures or ['?'])} model; generation needs a causal LM "
                        "(e.g. a language-modelling or chat run's final/hf)")
    tokenizer_files = {p.name: p.read_text(encoding="utf-8") for p in files
                       if p.suffix in TOKENIZER_SUFFIXES and p.name != "config.json"
                       and not p.name.startswith(("generation_config", "model.safetensors"))}
    if "tokenizer.json" not in tokenizer_files:
        raise UserError(f"{path}: no tokenizer.json beside the model; a run's final/hf has its tokenizer, or save one "
                        "there with the tokenizer's save_pretrained")
    with no_progress_bars():
        lm = load_weights_safely(lambda: AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, trust_remote_code=False), str(path), "PATH")
    return HFModel(lm, pad_token_id=None, images=False, causal=True), {"tokenizer_files": tokenizer_files}, "hf", str(path)


def check_causal_lm(trained: Trained) -> None:
    if not task_of(trained.info).generates:
        raise UserError(f"{trained.source}: generate needs a causal language model run (task: lm, e.g. "
                        f"data.source: textfile with model.name: hf); this run was trained for {trained.info.task}")
    name = trained.config.model.name
    if name not in MODELS:
        raise UserError(f"{trained.source}: generate supports model.name hf (causal LMs) and gpt; this run's model "
                        f"is {name!r}")


class Detokenizer:
    """New token ids in, new whole characters out: each push decodes everything generated so far and hands
    on what was not handed on yet, holding back a character still cut in the middle of its bytes (U+FFFD).
    With a `stop_text`, the text ends before its first occurrence (`stopped`), and an end of the text that may
    be the start of it is held back until it is known not to be."""

    def __init__(self, decode: Callable[[Sequence[int]], str], on_text: Optional[Callable[[str], None]],
                 stop_text: Optional[str] = None) -> None:
        self.decode, self.on_text, self.stop_text = decode, on_text, stop_text
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def text_of(self, ids: Sequence[int]) -> tuple[str, bool]:
        """The text of `ids` up to the stop text, and whether it was reached."""
        text = self.decode(ids)
        at = text.find(self.stop_text) if self.stop_text else -1
        return (text, False) if at < 0 else (text[:at], True)

    def push(self, ids: Sequence[int]) -> None:
        self.ids.extend(int(i) for i in ids)
        text, self.stopped = self.text_of(self.ids)
        if self.stop_text and not self.stopped:
            text = text[: len(text) - _partial_at_end(text, self.stop_text)]
        if not text.endswith("\ufffd"):
            self._send(text)

    def finish(self) -> str:
        text, self.stopped = self.text_of(self.ids)
        self._send(text)
        return self.sent

    def _send(self, text: str) -> None:
        if len(text) > len(self.sent) and text.startswith(self.sent):
            piece, self.sent = text[len(self.sent):], text
            if self.on_text is not None:
                self.on_text(piece)


def _partial_at_end(text: str, stop: str) -> int:
    """The length of the longest end of `text` that is a start of `stop`."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


# ---- the two ways to generate ----------------------------------------------------------------------------------

@torch.no_grad()
def _generate_hf(model: nn.Module, ids: list[int], *, device: torch.device, max_new_tokens: int, temperature: float,
                 top_p: float, stops: tuple[int, ...], pad_id: Optional[int], streamer_for: Detokenizer,
                 notes: list[str]) -> list[int]:
    # heavy (transformers): loaded already, the run's model is a transformers one
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

    class Streamer(BaseStreamer):
        """generate() puts the prompt first, then each new token."""

        def __init__(self) -> None:
            self.prompt_seen = False

        def put(self, value: torch.Tensor) -> None:
            if self.prompt_seen:
                streamer_for.push(value.reshape(-1).tolist())
            self.prompt_seen = True

        def end(self) -> None:
            pass

    class StopText(StoppingCriteria):
        """The end-of-turn text of the chat template has been generated (decoded the way the streamer does: it
        sees each token only after this check)."""

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
            reached = streamer_for.text_of(input_ids[0, len(ids):].tolist())[1]
            return torch.full((input_ids.shape[0],), reached, dtype=torch.bool, device=input_ids.device)

    lm = model.model  # HFModel wraps the transformers model (or its PEFT wrapper, which generates the same way)
    context = _context_length(lm)
    if context is not None:
        if len(ids) >= context:
            raise UserError(f"prompt: {len(ids)} tokens, the model's whole context is {context}; shorten it")
        if len(ids) + max_new_tokens > context:
            notes.append(f"max_new_tokens {max_new_tokens} cut to {context - len(ids)}: the prompt's {len(ids)} "
                         f"tokens and the new ones must fit the model's context of {context}")
            max_new_tokens = context - len(ids)
    sampling = temperature > 0
    # A config of our own, not the model's generation_config: only temperature and top-p shape the sampling
    settings = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sampling, num_beams=1,
                                eos_token_id=list(stops) or None, pad_token_id=pad_id,
                                **(dict(temperature=temperature, top_p=top_p, top_k=0) if sampling else {}))
    x = torch.tensor([ids], dtype=torch.long, device=device)
    stop_text = StoppingCriteriaList([StopText()]) if streamer_for.stop_text else None
    out = lm.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=settings,
                      streamer=Streamer(), stopping_criteria=stop_text)
    return out[0, len(ids):].tolist()


def _context_length(lm: nn.Module) -> Optional[int]:
    config = getattr(lm, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@torch.no_grad()
def _generate_gpt(model: nn.Module, ids: list[int], *, device: torch.device, max_new_tokens: int,
                  temperature: float, top_p: float, stops: tuple[int, ...], vocab_size: Optional[int],
                  generator: torch.Generator, detokenizer: Detokenizer) -> list[int]:
    """nanoGPT's sampling loop: the last block_size tokens in, the last position's logits out, one token on."""
    x = torch.tensor([ids], dtype=torch.long, device=device)
    new: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(x[:, -model.block_size:])[0, -1].float()
        if vocab_size is not None and vocab_size < logits.numel():
            logits[vocab_size:] = float("-inf")  # padded vocabulary (e.g. 50304): never a real token
        token = int(logits.argmax()) if temperature == 0 else _sample(logits, temperature, top_p, generator)
        new.append(token)
        detokenizer.push([token])
        if token in stops or detokenizer.stopped:
            break
        x = torch.cat([x, torch.tensor([[token]], dtype=torch.long, device=device)], dim=1)
    return new


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """Temperature, then nucleus: the smallest set of most likely tokens whose probability reaches top_p."""
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(0) - sorted_probs  # probability of the tokens ranked above each one
    sorted_probs[before >= top_p] = 0.0  # the first token always stays (0 < top_p)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return int(order[choice])


# ---- answers to fixed validation prompts, at each evaluation of a chat run --------------------------------------

EVAL_PROMPTS = 3  # conversations of the val split whose first answer is generated at each evaluation
EVAL_NEW_TOKENS = 48
SAMPLES_FILE = SAMPLES  # in the run directory: {"step", "prompt", "answer", "reference"} a line


def val_prompts(samples: Any, limit: int = EVAL_PROMPTS) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference ids) of the first conversation of each of the first `limit` windows of a chat split:
    the prompt is the conversation up to its first answer, the reference that answer (its loss tokens)."""
    out = []
    for i in range(min(limit, len(samples))):
        x, y = samples[i]
        ids, labelled = x[0].tolist(), (y != -100).nonzero().flatten().tolist()
        if not labelled:
            continue
        first = last = labelled[0]
        while last + 1 in labelled:
            last += 1
        out.append((ids[: first + 1], ids[first + 1 : last + 2]))
    return out


def answer_prompts(model: nn.Module, preprocess: dict[str, Any], prompts: list[tuple[list[int], list[int]]], *,
                   device: torch.device, max_new_tokens: int = EVAL_NEW_TOKENS) -> list[dict[str, str]]:
    """Greedy answers of `model` (an hf causal LM, in training) to `prompts`, decoded with the run's tokenizer:
    what the report shows beside the validation loss. The model is left in the mode it was in."""
    codec = codec_for(preprocess)
    stop_ids, stop_text = codec.end_of_turn()
    stops = tuple(dict.fromkeys([*codec.eos_ids, *stop_ids]))
    was_training, rows = model.training, []
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # training's RNG untouched
            for ids, reference in prompts:
                out = Detokenizer(codec.decode, None, stop_text)
                _generate_hf(model, ids, device=device, max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0,
                             stops=stops, pad_id=codec.pad_id, streamer_for=out, notes=[])
                rows.append({"prompt": codec.shown(ids), "answer": out.finish(),
                             "reference": Detokenizer(codec.decode, None, stop_text).text_of(reference)[0]})
    finally:
        model.train(was_training)
    return rows
