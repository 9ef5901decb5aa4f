"""A pure-Python grammar backend that only serves ``choice``: the output must be one of the strings."""

import torch

from kernelcore.structured_output.backend import GrammarMatcher, StructuredOutputBackend, UnsupportedConstraint


class ChoiceMatcher(GrammarMatcher):
    def __init__(self, backend, choices):
        self.backend, self.choices, self.text, self.history = backend, choices, "", []

    def _ok(self, text):
        return any(c.startswith(text) for c in self.choices)

    def accept_token(self, token_id):
        if token_id == self.backend.eos:
            self.history.append(self.text)
            return self.text in self.choices
        text = self.text + self.backend.pieces[token_id]
        if not self._ok(text):
            return False
        self.history.append(self.text)
        self.text = text
        return True

    def fill_bitmask(self, bitmask, row):
        allowed = [t for t, piece in enumerate(self.backend.pieces) if piece and self._ok(self.text + piece)]
        if self.text in self.choices:
            allowed.append(self.backend.eos)
        bits = torch.zeros(bitmask.shape[1] * 32, dtype=torch.bool)
        bits[allowed] = True
        words = (bits.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(1)
        bitmask[row] = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)

    def is_terminated(self):
        return self.text in self.choices and not any(c != self.text and c.startswith(self.text) for c in self.choices)

    def rollback(self, num_tokens):
        for _ in range(num_tokens):
            self.text = self.history.pop()


class ChoiceBackend(StructuredOutputBackend):
    name = "dummy_choice"

    def __init__(self, tokenizer, vocab_size):
        self.pieces = [tokenizer.decode([t]) if t < len(tokenizer) else "" for t in range(vocab_size)]
        self.eos = tokenizer.eos_token_id

    def compile(self, params):
        if params.kind != "choice":
            raise UnsupportedConstraint(f"dummy_choice serves only choice constraints, not {params.kind}")
        return list(params.choice)

    def matcher(self, compiled):
        return ChoiceMatcher(self, compiled)
