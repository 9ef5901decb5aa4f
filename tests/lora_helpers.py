"""Random PEFT LoRA adapters made with the `peft` library (lora_B non-zero, so the delta is not zero)."""

from __future__ import annotations

import os

import torch

TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "opt": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"],
}


def make_peft_adapter(base_dir: str, path: str, arch: str, seed: int, rank: int = 8, alpha: float = 16,
                      use_rslora: bool = False, targets: list[str] | None = None, std: float = 0.1,
                      safe_serialization: bool = True) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, use_rslora=use_rslora, target_modules=targets or TARGETS[arch],
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, std)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=safe_serialization)
    if not safe_serialization and not os.path.isfile(os.path.join(path, "adapter_model.bin")):
        from safetensors.torch import load_file

        file = os.path.join(path, "adapter_model.safetensors")
        torch.save(load_file(file), os.path.join(path, "adapter_model.bin"))
        os.remove(file)
    return path


def peft_logits(base_dir: str, adapter_dir: str | None, token_ids: list[int]) -> torch.Tensor:
    """Full-sequence float32 logits of transformers (+ the PEFT adapter when given)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()
