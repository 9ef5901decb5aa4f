"""Random PEFT LoRA adapters made with the `peft` library (lora_B non-zero, so the delta is not zero)."""

from __future__ import annotations

import os

import torch

TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
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


def make_bad_shape_adapter(good_dir: str, path: str, module: str = "k_proj", part: str = "B") -> str:
    """A copy of a good adapter with the right rank but one module's lora_A/lora_B of the wrong width (doubled)."""
    import shutil

    from safetensors.torch import load_file, save_file

    os.makedirs(path, exist_ok=True)
    shutil.copy(os.path.join(good_dir, "adapter_config.json"), path)
    state = load_file(os.path.join(good_dir, "adapter_model.safetensors"))
    key = next(k for k in state if f".{module}.lora_{part}." in k)
    t = state[key]
    state[key] = torch.randn(2 * t.shape[0], t.shape[1]) if part == "B" else torch.randn(t.shape[0], 2 * t.shape[1])
    save_file(state, os.path.join(path, "adapter_model.safetensors"))
    return path


class _Payload:
    """Pickles to code that creates ``marker`` when unpickled (what ``weights_only`` must refuse)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def make_pickle_payload_adapter(good_dir: str, path: str, marker: str) -> str:
    """A good adapter's config with an adapter_model.bin whose unpickling would create ``marker``."""
    import shutil

    os.makedirs(path, exist_ok=True)
    shutil.copy(os.path.join(good_dir, "adapter_config.json"), path)
    torch.save({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": _Payload(marker)},
               os.path.join(path, "adapter_model.bin"))
    return path
