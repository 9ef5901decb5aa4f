from kernelcore import hookimpl
from kernelcore.speculative.proposer import Proposer


class RepeatLastProposer(Proposer):
    """Guesses that the last token repeats (runs of spaces, table rules, padding)."""

    def __init__(self, config, vocab_size):
        self.max_run = config.speculative.options.get("max_run", 8)  # an extra key of --speculative-config

    def propose(self, requests):
        return [[r.token_ids[-1]] * min(r.num_tokens, self.max_run) for r in requests]


@hookimpl
def register_speculative_proposers(registry):
    # kc serve --speculative-config '{"method": "repeat_last", "num_speculative_tokens": 4}'
    registry.register("repeat_last", RepeatLastProposer)
