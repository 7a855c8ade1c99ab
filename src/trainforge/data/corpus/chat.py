"""Chat data into token windows (`data.source: chat`, read by `data/sources/chat.py`): each conversation rendered with
the chat template (`tokenizer.apply_chat_template`; the tokenizer's own, else a built-in one of
data/text/chat_templates.py) and tokenized with the model's tokenizer — the stored one, with the stored template, on
eval and resume (`tokenize_chat`) — dropping a conversation longer than `seq_len` tokens as `too_long` (never cut),
one the template refuses as `corrupt`, one without a token to learn as `empty_text`. The pipeline splits by
conversation (seeded, random) and lays each split's conversations into windows of `seq_len` tokens (`pack_chat`): one
a window, right-padded with the tokenizer's pad id, or with `pack: true` as many as fit (first fit, in order).

A sample is (x, y): x int64 (2, seq_len) = [token ids; position ids], y int64 (seq_len,) the next-token labels.
- Position ids count 0, 1, ... from the start of each conversation; the padding after the last one keeps
  counting from it. An unpacked window's positions are thus exactly 0..seq_len-1 (a plain causal sequence), and a
  packed one's restart at each conversation, where transformers (given position_ids and no attention mask)
  separates the conversations' attention.
- y[t] = ids[t + 1] where token t + 1 belongs to the same conversation and carries loss, else -100: never across
  two conversations, never on padding, and the last token of a conversation has none. Cross-entropy of
  logits[:, t] against y[t] (ignore_index -100) is the causal LM loss.
- `train_on: assistant` (default): loss on the assistant turns only, each one's content and its end-of-turn
  marker. A turn's text is found by rendering the conversation before it with the generation prompt and through
  it: what lies in between, trailing whitespace left out (chatml: `Hi<|im_end|>`); tokens overlapping it carry
  loss. The marker is one token when the tokenizer has it as a special token, else the tokens of its text. A
  template that renders earlier turns differently from the last (the two renderings are no prefixes of the
  whole) falls back to the content's own text plus the one token after it. `train_on: all`: every token.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Callable, Optional, Protocol

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import Pool, Samples
from trainforge.data.text.chat_templates import DEFAULT_TEMPLATE, TEMPLATES
from trainforge.data.text.tokenizer import ENCODE_CHUNK, TextTokenizer, tokenizer_note, transformers_tokenizer
from trainforge.errors import quote

IGNORE = -100  # the label of a position without loss (cross-entropy's ignore_index)

Message = dict[str, str]
Render = Callable[[list[Message], bool], str]


class ChatOptions(Protocol):
    """What tokenizing reads of a chat source's arguments (data.args; the source's ChatArgs has them): said here, so
    that this module, which the source imports, needs nothing of the source's."""

    seq_len: int
    template: str
    train_on: str
    pack: bool


class ChatTokens(Samples):
    """Tokenized conversations, flat: conversation i is tokens[starts[i]:starts[i + 1]]; `loss` marks the tokens
    that carry loss (never a conversation's first one). The pipeline splits them and lays them into windows."""

    contiguous = False  # independent conversations, not windows of one text: split at random

    def __init__(self, tokens: np.ndarray, loss: np.ndarray, starts: np.ndarray, ids: list[str], args: ChatOptions,
                 pad_id: int) -> None:
        self.tokens, self.loss, self.starts, self.ids, self.args, self.pad_id = tokens, loss, starts, ids, args, pad_id

    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.starts[i], self.starts[i + 1]
        return self.tokens[a:b], self.loss[a:b]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("ChatTokens are laid out in windows by the pipeline before they are read")

    def after_split(self, pool: Pool, splits: dict[str, np.ndarray], cfg: DataConfig,
                    stored: Optional[dict[str, Any]]) -> tuple[Pool, dict[str, np.ndarray]]:
        return pack_chat(pool, splits)  # split by conversation, then each split's laid into its own windows


class ChatWindows(Samples):
    """The samples: window k holds conversations order[bounds[k]:bounds[k + 1]], built on demand (module doc)."""

    def __init__(self, tokens: ChatTokens, order: np.ndarray, bounds: np.ndarray) -> None:
        self.tokens, self.order, self.bounds = tokens, order, bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        seq_len = self.tokens.args.seq_len
        x = np.full((2, seq_len), self.tokens.pad_id, dtype=np.int64)
        y = np.full(seq_len, IGNORE, dtype=np.int64)
        at = n = 0
        for i in self.order[self.bounds[index] : self.bounds[index + 1]]:
            ids, loss = self.tokens.example(int(i))
            n = len(ids)
            x[0, at : at + n] = ids
            x[1, at : at + n] = np.arange(n)
            y[at : at + n - 1] = np.where(loss[1:], ids[1:], IGNORE)
            at += n
        x[1, at:] = np.arange(n, n + seq_len - at)  # padding keeps counting from the last conversation
        return torch.from_numpy(x), torch.from_numpy(y)


class NotRendered(ValueError):
    """The template does not render an assistant turn where it can be found."""


def tokenize_chat(pool: Pool, tok: TextTokenizer, stored: Optional[dict[str, Any]]) -> Pool:
    """ChatExamples -> ChatTokens: rendered, tokenized, loss marked; too-long, refused and lossless conversations
    dropped (counted in pool.drops). Info gets the tokenizer's vocabulary and padding; the report the token facts."""
    examples = pool.samples
    a: ChatOptions = examples.args
    hf = transformers_tokenizer(tok)
    name, template = choose_template(a.template, hf, stored)

    def render(messages: list[Message], prompt: bool) -> str:
        return hf.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=prompt)

    from jinja2 import TemplateError

    texts, spans, idents, refused = [], [], [], None
    for messages, ident in zip(examples.conversations, examples.ids):
        try:
            text, turns = render_turns(render, messages)
        except (TemplateError, ValueError) as err:  # e.g. a template that wants user and assistant to alternate
            pool.drops.drop("corrupt", ident)
            refused = refused or f"{ident}: {quote(str(err), 200)}"
            continue
        texts.append(text)
        spans.append(turns)
        idents.append(ident)

    sizes, parts, losses, kept = Counter[int](), [], [], []
    for start in range(0, len(texts), ENCODE_CHUNK):
        encoded = tok.backend.encode_batch(texts[start : start + ENCODE_CHUNK], add_special_tokens=False)
        for enc, turns, ident in zip(encoded, spans[start:], idents[start:]):
            n = len(enc.ids)
            sizes[bucket(n)] += 1
            if n > a.seq_len:
                pool.drops.drop("too_long", ident)
                continue
            loss = loss_mask(enc.offsets, turns) if a.train_on == "assistant" else np.ones(n, dtype=bool)
            loss[:1] = False  # the first token is no one's next token
            if not loss.any():
                pool.drops.drop("empty_text", ident)
                continue
            parts.append(np.asarray(enc.ids, dtype=np.int64))
            losses.append(loss)
            kept.append(ident)

    starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=starts[1:])
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    loss = np.concatenate(losses) if losses else np.zeros(0, dtype=bool)
    pool.samples = ChatTokens(tokens, loss, starts, kept, a, tok.pad_id)
    vocab = tok.vocab_size
    pool.info = DataInfo("lm", "text", (2, a.seq_len), "int64", vocab, (), vocab, a.seq_len, pad_id=tok.pad_id)
    pool.preprocess = {**pool.preprocess, **tok.to_preprocess(), "chat_template": template,
                       "chat_template_name": name, "train_on": a.train_on, "pack": a.pack}
    facts: dict[str, Any] = {
        "template": name, "train_on": a.train_on, "pack": a.pack, "seq_len": a.seq_len,
        # every rendered conversation, too-long ones included: "<=N" counts those of N/2 < tokens <= N
        "tokens_per_conversation": {f"<={b}": sizes[b] for b in sorted(sizes)},
        "tokens": int(len(tokens)), "loss_tokens": int(loss.sum()),
        "loss_token_share": round(float(loss.sum()) / max(len(tokens), 1), 4),
    }
    if refused:
        facts["first_refused"] = refused
    pool.notes = {**pool.notes, "chat": facts, "tokenizer": tokenizer_note(tok, {})}
    return pool


def choose_template(requested: str, hf: Any, stored: Optional[dict[str, Any]]) -> tuple[str, str]:
    """(name, jinja text): the stored one when there is one (eval, resume), else the tokenizer's own for auto,
    else the built-in one requested (chatml for auto)."""
    if stored and isinstance(stored.get("chat_template"), str):
        return str(stored.get("chat_template_name", "stored")), stored["chat_template"]
    own = None
    if getattr(hf, "chat_template", None):
        try:
            own = hf.get_chat_template()
        except ValueError:  # several named templates and no default among them
            own = None
    if requested == "auto":
        return ("tokenizer", own) if own else (DEFAULT_TEMPLATE, TEMPLATES[DEFAULT_TEMPLATE])
    if own:
        warnings.warn(f"data.args.template: {requested} replaces the tokenizer's own chat template")
    return requested, TEMPLATES[requested]


def render_turns(render: Render, messages: list[Message]) -> tuple[str, list[tuple[int, int, bool]]]:
    """The rendered conversation and, for each assistant turn, (start, end, add_next_token): the characters that
    carry loss (module doc)."""
    full = render(messages, False)
    turns, cursor = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(messages[:i], True) if i else ""
        through = render(messages[: i + 1], False).rstrip()
        if full.startswith(before) and full.startswith(through) and cursor <= len(before) < len(through):
            turns.append((len(before), len(through), False))
            cursor = len(through)
            continue
        text = m["content"].strip()  # fallback: the content itself, and the token after it
        at = full.find(text, cursor) if text else -1
        if at < 0:
            raise NotRendered(f"the chat template does not render assistant message {i} as it is")
        turns.append((at, at + len(text), True))
        cursor = at + len(text)
    return full, turns


def loss_mask(offsets: list[tuple[int, int]], turns: list[tuple[int, int, bool]]) -> np.ndarray:
    """Which tokens (by their character offsets) overlap an assistant turn."""
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = off[:, 0], off[:, 1]
    loss = np.zeros(len(off), dtype=bool)
    for start, end, add_next in turns:
        loss |= (ends > start) & (starts < end)
        after = np.flatnonzero(starts >= end)
        if add_next and len(after):
            loss[after[0]] = True
    return loss


def bucket(n: int) -> int:
    """The power of two that bounds n from above (1, 2, 4, ...)."""
    return 1 << max(n - 1, 0).bit_length()


def first_fit(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Positions in `lengths` grouped into bins of `capacity`: each into the first bin with room, in order
    (a max-tree over the bins' free space finds it in log time). Every length must be <= capacity."""
    size = 1
    while size < max(len(lengths), 1):
        size *= 2
    free = [capacity] * (2 * size)  # free[node] = the most room in any bin below node; bins are leaves
    bins: list[list[int]] = []
    for pos, n in enumerate(lengths.tolist()):
        node = 1
        while node < size:
            node = 2 * node if free[2 * node] >= n else 2 * node + 1
        leaf = node - size
        if leaf == len(bins):
            bins.append([])
        bins[leaf].append(pos)
        free[node] -= n
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return bins


def pack_chat(pool: Pool, splits: dict[str, np.ndarray]) -> tuple[Pool, dict[str, np.ndarray]]:
    """ChatTokens -> ChatWindows, each split's conversations in windows of its own; the splits become window
    indices. The report gets conversations and windows per split and how full the windows are."""
    tokens = pool.samples
    assert isinstance(tokens, ChatTokens)
    a, lengths = tokens.args, tokens.lengths
    order: list[int] = []
    bounds, windows = [0], {}
    for name, idx in splits.items():
        first = len(bounds) - 1
        groups = first_fit(lengths[idx], a.seq_len) if a.pack else [[j] for j in range(len(idx))]
        for group in groups:
            order.extend(int(idx[j]) for j in group)
            bounds.append(len(order))
        windows[name] = np.arange(first, len(bounds) - 1)
    pool.samples = ChatWindows(tokens, np.asarray(order, dtype=np.int64), np.asarray(bounds, dtype=np.int64))
    pool.rows_kept = len(tokens)
    num_windows = len(bounds) - 1
    pool.notes["chat"] = {
        **pool.notes["chat"],
        "conversations": {name: len(idx) for name, idx in splits.items()},
        "windows": {name: len(w) for name, w in windows.items()},
        "window_fill": round(len(tokens.tokens) / max(num_windows * a.seq_len, 1), 4),
    }
    return pool, windows
