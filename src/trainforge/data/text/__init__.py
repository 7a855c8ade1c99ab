"""Text into token ids, in one place. Imports nothing at import time: `trainforge predict` and the token shards' pool
workers use the torch-free modules (`bytes`, `tokenizer`) without loading the others.

- `bytes`: the byte tokenizers (`bytes`: classification; `raw_bytes`: language modelling);
- `tokenizer`: subword tokenizers (`TextTokenizer`: a pretrained model's, or a BPE trained on the data);
- `chat_templates`: the built-in chat templates of `data.source: chat`.
"""
