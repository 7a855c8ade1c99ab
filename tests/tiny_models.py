"""Tiny "pretrained" models saved locally the way the hub ships them (save_pretrained: config, weights and a
fast tokenizer), so tests load them through exactly the code users run with hub ids. Nothing downloads."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda sigma omega red green blue yellow "
         "black white apple banana cherry grape lemon mango the a of and is was on in to").split()

TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=128)
TINY_LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64, max_position_embeddings=256)


def corpus(n: int = 400) -> list[str]:
    """Deterministic sentences over WORDS (tokenizer training text)."""
    g = torch.Generator().manual_seed(0)
    return [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (8,), generator=g)) for _ in range(n)]


def write_labelled_texts(path: Path, texts: Iterable[str]) -> Path:
    """A text-classification JSONL file (`data.source: jsonl`): {"text", "label"} a line, label 1 where the text
    mentions apple."""
    path.write_text("".join(json.dumps({"text": t, "label": int("apple" in t.split())}) + "\n" for t in texts))
    return path


def wordpiece_tokenizer(texts: Iterable[str], vocab_size: int = 200):
    """A BERT-style fast tokenizer ([CLS] text [SEP], [PAD] = 0, lower-casing WordPiece) whose vocabulary is fixed
    by `texts` alone: the special tokens, every character alone and as a ##piece, then whole words, most frequent
    first (ties by spelling). Not trained: the WordPiece trainer breaks ties in a different order from one process
    to the next, and a test's numbers would follow its token ids."""
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    counts = Counter(w for t in texts for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(t)))
    chars = sorted({c for w in counts for c in w})
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if w not in chars]
    vocab = [*specials, *chars, *(f"##{c}" for c in chars), *words][:vocab_size]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def bytelevel_tokenizer(texts: Iterable[str], vocab_size: int = 320):
    """A GPT/Llama-style byte-level BPE fast tokenizer with <s> and </s> and no padding token."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def save_tiny_bert(path: Path, *, num_labels: int = 2, seed: int = 1, **config) -> Path:
    """A BERT sequence classifier with its WordPiece tokenizer, as `save_pretrained` writes it; `config` overrides
    BertConfig fields (e.g. hidden_dropout_prob=0.0 where runs of different world sizes must match)."""
    from transformers import AutoModelForSequenceClassification, BertConfig

    tok = wordpiece_tokenizer(corpus())
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, num_labels=num_labels,
                        **{**TINY_BERT, **config})
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_tiny_llama(path: Path, *, seed: int = 1, chat_template: Optional[str] = None, **config) -> Path:
    """A Llama-shaped causal LM with its byte-level BPE tokenizer, as `save_pretrained` writes it; `config`
    overrides LlamaConfig fields (e.g. tie_word_embeddings=True); `chat_template`: the tokenizer's (none by default)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = bytelevel_tokenizer(corpus())
    if chat_template is not None:
        tok.chat_template = chat_template
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         **{**TINY_LLAMA, **config})
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


# a DETR small enough to train on a CPU in seconds: a 4-stage basic ResNet of 16-128 channels, one encoder and one
# decoder layer of width 64, 20 queries
TINY_DETR = dict(backbone_config={"model_type": "resnet", "depths": [1, 1, 1, 1], "hidden_sizes": [16, 32, 64, 128],
                                  "embedding_size": 16, "layer_type": "basic", "out_features": ["stage4"]},
                 d_model=64, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=128, decoder_ffn_dim=128,
                 encoder_attention_heads=2, decoder_attention_heads=2, num_queries=20)


def save_tiny_detr(path: Path, *, num_labels: int = 3, seed: int = 1) -> Path:
    """A DETR object detector with its image processor, as `save_pretrained` writes them (the hub's
    facebook/detr-resnet-50 folder, scaled down)."""
    from transformers import AutoModelForObjectDetection, DetrConfig, DetrImageProcessor

    torch.manual_seed(seed)
    AutoModelForObjectDetection.from_config(DetrConfig(num_labels=num_labels, **TINY_DETR)).save_pretrained(path)
    DetrImageProcessor().save_pretrained(path)
    return path
