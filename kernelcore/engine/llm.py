"""The offline API: ``LLM(model).generate(prompts, SamplingParams(...))`` and ``llm.chat(messages)``."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from tqdm.auto import tqdm

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.core import EngineCore
from kernelcore.engine.output_processor import OutputProcessor
from kernelcore.engine.outputs import RequestOutput
from kernelcore.engine.scheduler import RequestRejected
from kernelcore.engine.tokenizer import encode_chat, encode_prompt, eos_token_id, try_get_tokenizer

if TYPE_CHECKING:
    from kernelcore.engine.core_client import MPEngineCoreClient

PromptType = str | dict[str, Any]
logger = logging.getLogger("kernelcore.llm")


class LLM:
    def __init__(self, model: str | None = None, tensor_parallel_size: int = 1, max_model_len: int | None = None,
                 block_size: int | None = None, kv_cache_memory: int | None = None, dtype: str | None = None,
                 hf_overrides: dict[str, Any] | None = None, seed: int | None = None, multiprocess: bool = False,
                 **kwargs: Any) -> None:
        from kernelcore.config_builder import build_config, load_hf_config

        self.config = build_config(model=model, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                                   block_size=block_size, kv_cache_memory=kv_cache_memory, dtype=dtype,
                                   hf_overrides=hf_overrides, seed=seed, **kwargs)
        self.tokenizer = None if self.config.model.skip_tokenizer_init else \
            try_get_tokenizer(self.config.model.tokenizer or self.config.model.model)
        self.eos_token_id = eos_token_id(self.tokenizer, load_hf_config(self.config.model))
        # multiprocess=True runs the scheduler and model in the engine-core process (the server's topology);
        # the default keeps them in this process, which needs no `if __name__ == "__main__":` guard.
        if multiprocess:
            from kernelcore.engine.core_client import MPEngineCoreClient

            self.engine_core: EngineCore | MPEngineCoreClient = MPEngineCoreClient(self.config)
        else:
            self.engine_core = EngineCore(self.config)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._counter = itertools.count()
        self._lora_paths: dict[int, str] = {}  # adapters the engine knows

    def shutdown(self) -> None:
        """Stop the engine (its processes, when multiprocess or tensor parallel)."""
        self.engine_core.shutdown()

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request: Any = None) -> list[RequestOutput]:
        """``lora_request``: a :class:`~kernelcore.lora.LoRARequest` for every prompt, or a list (None = base model)."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = self._params_list(sampling_params, len(prompts))
        lora_ids = self._lora_ids(lora_request, len(prompts))
        request_ids = []
        try:
            for prompt, p, lora_id in zip(prompts, params, lora_ids, strict=True):
                if isinstance(prompt, str):
                    request_ids.append(self._add_request(prompt, self._encode(prompt), p, lora_id))
                elif "prompt_token_ids" in prompt:
                    request_ids.append(self._add_request(prompt.get("prompt"), list(prompt["prompt_token_ids"]), p,
                                                         lora_id))
                else:
                    request_ids.append(self._add_request(prompt["prompt"], self._encode(prompt["prompt"]), p, lora_id))
        except Exception:
            self._abort(request_ids)
            raise
        return self._run(request_ids, use_tqdm)

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             **kwargs: Any) -> list[RequestOutput]:
        conversations = cast("list[list[dict[str, Any]]]",
                             [messages] if messages and isinstance(messages[0], dict) else messages)
        prompts = [{"prompt_token_ids": encode_chat(self.tokenizer, conv, chat_template, add_generation_prompt,
                                                    **kwargs)}
                   for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _params_list(self, sampling_params, num_prompts: int) -> list[SamplingParams]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        if len(sampling_params) != num_prompts:
            raise ValueError(f"got {len(sampling_params)} sampling params for {num_prompts} prompts")
        return list(sampling_params)

    def _lora_ids(self, lora_request: Any, num_prompts: int) -> list[int]:
        loras = list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * num_prompts
        if len(loras) != num_prompts:
            raise ValueError(f"got {len(loras)} LoRA requests for {num_prompts} prompts")
        for lora in loras:
            if lora is not None and self._lora_paths.get(lora.lora_id) != lora.path:
                from kernelcore.lora.adapter import load_adapter

                load_adapter(lora.path, self.config.lora.max_lora_rank)  # fail here, not inside a step
                self.engine_core.add_lora(lora.lora_id, lora.name, lora.path)
                self._lora_paths[lora.lora_id] = lora.path
        return [lora.lora_id if lora is not None else 0 for lora in loras]

    def _encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as {'prompt_token_ids': [...]}")
        return encode_prompt(self.tokenizer, prompt)

    def _add_request(self, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                     lora_id: int = 0) -> str:
        request_id = str(next(self._counter))
        params = params.clone(output_kind="final_only")
        core_requests = self.output_processor.add_request(request_id, prompt, prompt_token_ids, params,
                                                          self.eos_token_id, lora_id)
        try:
            for core_request in core_requests:
                self.engine_core.add_request(core_request)
        except Exception:
            self._abort([request_id])
            raise
        return request_id

    def _abort(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(self.output_processor.abort_requests(request_ids))

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True,
                   disable=None if use_tqdm else True)  # None: only on a terminal
        num_output_tokens = 0
        try:
            while len(finished) < len(request_ids):
                engine_outputs = self.engine_core.step()
                if engine_outputs.errors:  # failed alone (its adapter, its grammar): as the multiprocess client does
                    raise RequestRejected("; ".join(f"{rid}: {msg}" for rid, msg in engine_outputs.errors.items()))
                outputs, to_abort = self.output_processor.process_outputs(engine_outputs.outputs)
                if to_abort:
                    self.engine_core.abort_requests(to_abort)
                for output in outputs:
                    if output.finished:
                        finished[output.request_id] = output
                        num_output_tokens += sum(len(c.token_ids) for c in output.outputs)
                        bar.update(1)
                        if bar.format_dict.get("elapsed"):
                            bar.set_postfix_str(f"{num_output_tokens / bar.format_dict['elapsed']:.1f} toks/s",
                                                refresh=False)
                if not self.engine_core.has_unfinished_requests() and len(finished) < len(request_ids):
                    raise RuntimeError("the engine finished without answering every request")
        except BaseException:
            self._abort([r for r in request_ids if r not in finished])
            raise
        finally:
            bar.close()
        return [finished[r] for r in request_ids]
