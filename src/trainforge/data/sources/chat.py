"""`chat`: supervised fine-tuning data for a pretrained causal LM (`model.name: hf`, `data.tokenizer: model`).

data.path is a JSONL file, one conversation a line, either
    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
or  {"instruction": "...", "input": "..." (optional), "output": "..."}   (one user turn, one assistant turn).

The source reads and checks the lines: dropped as `corrupt` are lines that are not JSON, have no messages, a role
or a content of the wrong kind, or no assistant turn; as `duplicate` the same conversation again
(`data.clean.dedup`). The pipeline then renders and tokenizes them, splits them and lays them into windows
(data/corpus/chat.py: how, and what a sample is).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Optional

import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import DropLog, Pool, Samples
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.data.corpus.chat import Message, tokenize_chat
from trainforge.data.corpus.tokenize import choose_tokenizer
from trainforge.errors import UserError

CHAT_DROP_REASONS = ("duplicate", "corrupt", "empty_text", "too_long")
ROLES = ("system", "user", "assistant")


class ChatArgs(SourceArgs):
    seq_len: int = Field(1024, gt=1)
    template: Literal["auto", "chatml", "llama3", "alpaca"] = "auto"  # auto: the tokenizer's own, else chatml
    train_on: Literal["assistant", "all"] = "assistant"
    pack: bool = False


class ChatExamples(Samples):
    """Conversations before tokenization: the pipeline renders and tokenizes them (`tokenize_chat`)."""

    def __init__(self, conversations: list[list[Message]], ids: list[str], args: ChatArgs) -> None:
        assert len(conversations) == len(ids)
        self.conversations, self.ids, self.args = conversations, ids, args

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("ChatExamples are tokenized by the pipeline before they are read")

    def before_split(self, pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Pool:
        # rendered and tokenized whole: too-long ones are dropped before the split
        return tokenize_chat(pool, choose_tokenizer(cfg, lambda: [], stored), stored)


@SOURCES.register("chat")
def chat(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a JSONL file of conversations ({"messages": [...]} or {instruction, input, output} a line);
    data.tokenizer: model; args seq_len (1024), template (auto | chatml | llama3 | alpaca), train_on (assistant |
    all), pack (false)."""
    a = parse_args(ChatArgs, cfg)
    if cfg.tokenizer != "model":
        got = "it is not set" if cfg.tokenizer is None else f"got {cfg.tokenizer}"
        raise UserError(f"data.tokenizer: chat data is tokenized with the pretrained model's own tokenizer; set "
                        f"data.tokenizer: model ({got})", public=True)
    path = require_path(cfg, 'a JSONL file with one {"messages": [...]} or {"instruction", "output"} object per line')
    if not path.is_file():
        raise UserError(f"data.path: {path} is a folder; point it at a JSONL file of conversations", public=True)
    drops, seen = DropLog(CHAT_DROP_REASONS), set()
    conversations, ids, read = [], [], 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank line: not a record
            read += 1
            ident = f"line {line_no}"
            messages = conversation(_json(line))
            if messages is None:
                drops.drop("corrupt", ident)
                continue
            if cfg.clean.dedup:
                key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode("utf-8")).digest()
                if key in seen:
                    drops.drop("duplicate", ident)
                    continue
                seen.add(key)
            conversations.append(messages)
            ids.append(ident)
    # vocabulary and padding are the tokenizer's: tokenize_chat completes info
    info = DataInfo("lm", "text", (2, a.seq_len), "int64", 0, (), None, a.seq_len)
    return Pool(info, ChatExamples(conversations, ids, a), labels=None, rows_read=read, drops=drops,
                preprocess={"seq_len": a.seq_len})


def _json(line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def conversation(record: Any) -> Optional[list[Message]]:
    """The record's messages ({role, content} each), or None when it is no usable conversation."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        raw = record["messages"]
        if not isinstance(raw, list):
            return None
        messages = []
        for m in raw:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                return None
            messages.append({"role": m["role"], "content": m["content"]})
    else:
        instruction, given, output = record.get("instruction"), record.get("input"), record.get("output")
        given = "" if given is None else given
        if not (isinstance(instruction, str) and isinstance(given, str) and isinstance(output, str)):
            return None
        # one user message; it keeps instruction and input apart for the alpaca template's Input block
        content = f"{instruction}\n\n{given}" if given.strip() else instruction
        user = {"role": "user", "content": content, "instruction": instruction, "input": given}
        messages = [user, {"role": "assistant", "content": output}]
    return messages if any(m["role"] == "assistant" for m in messages) else None
