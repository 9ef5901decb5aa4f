import torch

from builtin_plugins.models.opt import OPTForCausalLM


class MyOPTForCausalLM(OPTForCausalLM):
    """OPT that always prefers token 0 (as the reference's dummy model does)."""

    def compute_logits(self, hidden_states):
        logits = super().compute_logits(hidden_states)
        logits[:, 0] = torch.finfo(logits.dtype).max
        return logits
