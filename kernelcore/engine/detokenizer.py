"""Incremental detokenization with stop strings.

New text = decode(ids[prefix:]) minus decode(ids[prefix:read]), emitted only when it grew and does not end in
an unfinished UTF-8 sequence; decoding a short window keeps the per-token cost constant. Stop strings are
searched in the new characters plus len(stop) - 1 of look-back; the last max(len(stop)) - 1 characters are held
back until the request finishes, so a partial stop string is never emitted and the deltas join to the final text.
"""

from __future__ import annotations

from kernelcore.core_types.sampling_params import SamplingParams

NUM_CONTEXT_TOKENS = 5


def _rust_backend(tokenizer):
    """The tokenizers-library object behind a fast tokenizer whose ``decode`` is exactly the backend's (no
    clean-up of spaces), else None. Two decodes per token are most of the front end's work for a streamed
    token; transformers' wrapper around the backend call is several times the call itself."""
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if callable(getattr(backend, "decode", None)) else None


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self._backend = _rust_backend(tokenizer)
        self.stop = params.stop or []
        self.include_stop = params.include_stop_str_in_output
        self.stop_buffer_length = params.stop_buffer_length
        self.token_ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.output_text = ""
        self.num_emitted_chars = 0

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, new_token_ids: list[int], is_stop_token: bool = False) -> str | None:
        """Add tokens; returns the stop string matched, if any (the text is then already cut)."""
        if is_stop_token and not self.include_stop:
            new_token_ids = new_token_ids[:-1]  # EOS / stop id text never appears
        num_old_chars = len(self.output_text)
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
            new_text = self._decode(self.token_ids[self.prefix_offset:])
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                self.output_text += new_text[len(prefix_text):]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            if len(self.token_ids) > 4 * NUM_CONTEXT_TOKENS + 64 and self.prefix_offset > 2 * NUM_CONTEXT_TOKENS:
                cut = self.prefix_offset
                self.token_ids = self.token_ids[cut:]
                self.prefix_offset, self.read_offset = 0, self.read_offset - cut
        if self.stop and len(self.output_text) > num_old_chars:
            return self._check_stop(num_old_chars)
        return None

    def _check_stop(self, num_old_chars: int) -> str | None:
        for stop in self.stop:
            start = max(0, num_old_chars - len(stop) + 1)
            index = self.output_text.find(stop, start)
            if index != -1:
                self.output_text = self.output_text[:index + len(stop) if self.include_stop else index]
                return stop
        return None

    def get_next_output_text(self, is_finished: bool, is_delta: bool) -> str:
        """The text to report now: all of it, or only what is new since the last call (is_delta)."""
        end = len(self.output_text) if is_finished else max(0, len(self.output_text) - self.stop_buffer_length)
        if not is_delta:
            return self.output_text[:end]
        start = self.num_emitted_chars
        if end <= start:
            return ""
        self.num_emitted_chars = end
        return self.output_text[start:end]
