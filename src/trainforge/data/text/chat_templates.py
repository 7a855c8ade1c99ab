"""The built-in chat templates of `data.source: chat` (`data.args.template`), as jinja text for
`tokenizer.apply_chat_template`: used when the tokenizer has no template of its own, or when one is named.

    chatml   <|im_start|>{role}\\n{content}<|im_end|>\\n                       (Qwen, many fine-tunes)
    llama3   {bos}<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>
    alpaca   ### Instruction:\\n...\\n\\n[### Input:\\n...\\n\\n]### Response:\\n{content}{eos}\\n\\n

Special tokens of a template that the tokenizer lacks (e.g. `<|im_end|>` for a tokenizer without it) are
simply tokenized as text: the markers still delimit the turns, they just take a few tokens each; a model
that should stop on one token needs it in its tokenizer. alpaca renders a user message made from an
`{instruction, input}` record with separate Instruction and Input blocks (the message keeps both), a system
message as a preamble, and ends each response with the tokenizer's eos token (nothing when it has none).
"""
from __future__ import annotations

CHATML = (
    r"{% for message in messages %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    r"{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3 = (
    r"{{ bos_token }}"
    r"{% for message in messages %}"
    r"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    r"{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

ALPACA = (
    r"{% for message in messages %}"
    r"{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    r"{% elif message['role'] == 'user' %}"
    r"{% if message['input'] is defined and message['input'] %}"
    r"{{ '### Instruction:\n' + message['instruction'] + '\n\n### Input:\n' + message['input'] + '\n\n' }}"
    r"{% else %}{{ '### Instruction:\n' + message['content'] + '\n\n' }}{% endif %}"
    r"{% else %}{{ '### Response:\n' + message['content'] }}{{ eos_token }}{{ '\n\n' }}{% endif %}"
    r"{% endfor %}"
    r"{% if add_generation_prompt %}{{ '### Response:\n' }}{% endif %}"
)

TEMPLATES: dict[str, str] = {"chatml": CHATML, "llama3": LLAMA3, "alpaca": ALPACA}
DEFAULT_TEMPLATE = "chatml"  # `template: auto` for a tokenizer without a chat template of its own
