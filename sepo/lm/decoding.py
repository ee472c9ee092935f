"""Turning generated tokens back into text while they are generated, a token at a time."""

from __future__ import annotations

from typing import Any


class IncrementalText:
    """The decoded text of a growing token sequence, decoding only a short window per new token.

    Decoding the whole answer at every generation step costs O(length) per step, O(length^2) per
    answer. This is the streaming detokenizer of text-generation servers: it decodes the tokens
    since the last emitted boundary with and without the newest ones and appends the difference,
    holding text back while it ends in an incomplete UTF-8 character. Decoding from a window that
    starts one emitted piece earlier keeps tokenizers that drop a leading space (SentencePiece)
    right. The accumulated text equals `tokenizer.decode(all tokens)` whenever that does not end
    in an incomplete character.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # start of the window decoded for comparison
        self._read = 0  # tokens already turned into text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token: int) -> str:
        """Append one token; returns the text it completed (may be empty)."""
        self.ids.append(int(token))
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            piece = after[len(before) :]
            self.text += piece
            self._prefix, self._read = self._read, len(self.ids)
            return piece
        return ""
