"""A Llama whose logits ignore its weights: at absolute position p it predicts ``kc_script[p]`` (else EOS).

``kc_script`` in config.json maps a prompt length P to the token ids to generate after a P-token prompt; the
windows of different scripts must not overlap, so one model serves several scripted conversations.
"""

import torch

from builtin_plugins.models.llama import LlamaForCausalLM
from kernelcore.config import get_current_config
from kernelcore.models import get_hf_config


class KcScriptedLlama(LlamaForCausalLM):
    def __init__(self, config, prefix: str = "") -> None:
        super().__init__(config, prefix)
        hf_config = get_hf_config(get_current_config())
        self.vocab_size = hf_config.vocab_size
        self.eos = hf_config.eos_token_id
        table = torch.full((hf_config.max_position_embeddings + 1,), self.eos, dtype=torch.long)
        for start, ids in getattr(hf_config, "kc_script", {}).items():
            table[int(start) - 1:int(start) - 1 + len(ids)] = torch.tensor(ids)
        self.table = table

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return positions.unsqueeze(1).to(torch.float32)  # the "hidden state" is the position

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        targets = self.table[hidden[:, 0].long()]
        logits = torch.zeros(hidden.shape[0], self.vocab_size)
        logits[torch.arange(hidden.shape[0]), targets] = 30.0
        return logits
