from __future__ import annotations

from trainforge.data import text


def test_bytes_tokenizer_pads_truncates_and_round_trips():
    ids = text.encode("hé!", 6)
    assert ids == [ord("h") + 1, 0xC3 + 1, 0xA9 + 1, ord("!") + 1, 0, 0]
    assert text.decode(ids) == "hé!"
    assert text.encode("abcdef", 3) == [98, 99, 100]
    assert max(text.encode("\xff" * 4, 8)) < text.BYTES_VOCAB_SIZE


def test_raw_bytes_tokenizer():
    assert text.encode_raw("ab") == [97, 98]
    assert text.decode_raw([104, 105]) == "hi"
