"""The engine: scheduler, KV cache manager, sampler, detokenizer, EngineCore and the offline LLM."""
