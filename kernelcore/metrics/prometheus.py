"""Prometheus stat logger: the contract's metric set under a prefix (``kc:`` by default, ``vllm:`` for vLLM's
dashboards), plus prometheus_client's process and platform collectors, in its own registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import prometheus_client as prom

from kernelcore.contract.stat_logger import StatLoggerBase
from kernelcore.metrics.request_stats import FinishedRequestStats
from kernelcore.metrics.stats import EngineStats

TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")


class PrometheusStatLogger(StatLoggerBase):
    """Publishes engine and request statistics; ``generate_latest()`` renders the text exposition."""

    def __init__(self, config: Any = None, model_name: str | None = None, prefix: str = "kc") -> None:
        super().__init__(config)
        prom.disable_created_metrics()  # the *_created series only add noise to the scrape
        if model_name is None:
            model_name = getattr(getattr(config, "model", None), "served_model_name", None) or "model"
        self.prefix = prefix
        self.registry = prom.CollectorRegistry(auto_describe=True)
        prom.ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, resident memory, open fds
        prom.PlatformCollector(registry=self.registry)  # python_info
        labels = {"model_name": model_name}  # every series carries these (more labels: add them here)

        def name_of(name: str) -> str:
            return f"{prefix}:{name}"

        def gauge(name: str, doc: str):
            return prom.Gauge(name_of(name), doc, list(labels), registry=self.registry).labels(**labels)

        def counter(name: str, doc: str):
            return prom.Counter(name_of(name), doc, list(labels), registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: Sequence[float]):
            return prom.Histogram(name_of(name), doc, list(labels), buckets=buckets,
                                  registry=self.registry).labels(**labels)

        self.num_requests_running = gauge("num_requests_running", "Requests running in the engine.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage_perc = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).")
        cache_info = prom.Gauge(name_of("cache_config_info"), "Cache configuration.", ["model_name", "block_size",
                                "enable_prefix_caching", "num_blocks"], registry=self.registry)
        cache = getattr(config, "cache", None)
        cache_info.labels(model_name=model_name, block_size=str(getattr(cache, "block_size", "")),
                          enable_prefix_caching=str(getattr(cache, "enable_prefix_caching", "")),
                          num_blocks=str(getattr(cache, "num_blocks", ""))).set(1)
        lora_info = prom.Gauge(name_of("lora_requests_info"), "Running and waiting LoRA adapters.",
                               ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=self.registry)
        lora = getattr(config, "lora", None)
        self._lora_info, self._lora_labels = lora_info, (str(getattr(lora, "max_loras", 0)), "", "")
        self._lora_series = lora_info.labels(*self._lora_labels)  # record() runs every step: the lookup once
        self._lora_series.set(0)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Generation tokens produced.")
        self.num_preemptions = counter("num_preemptions", "Cumulative preemptions.")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.spec_num_drafts = counter("spec_decode_num_drafts", "Speculative verifications (a request's drafts "
                                       "checked in one forward pass).")
        self.spec_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self._spec_per_pos = prom.Counter(name_of("spec_decode_num_accepted_tokens_per_pos"),
                                          "Draft tokens accepted, by position in the draft (0 = first).",
                                          ["model_name", "position"], registry=self.registry)
        self._model_name = model_name
        spec = getattr(config, "speculative", None)
        for position in range(spec.num_speculative_tokens if spec is not None and spec.enabled else 0):
            self._spec_per_pos.labels(model_name=model_name, position=str(position))  # a series at 0 from the start
        success = prom.Counter(name_of("request_success"), "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=self.registry)
        self.request_success = {reason: success.labels(model_name=model_name, finished_reason=reason)
                                for reason in FINISH_REASONS}

        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.request_generation_tokens = histogram("request_generation_tokens", "Generated tokens per request.",
                                                   TOKEN_BUCKETS)
        self.request_params_n = histogram("request_params_n", "The n parameter of requests.", [1, 2, 5, 10, 20])
        self.request_params_max_tokens = histogram("request_params_max_tokens", "The max_tokens parameter.",
                                                   TOKEN_BUCKETS)
        self.request_max_num_generation_tokens = histogram("request_max_num_generation_tokens",
                                                           "Longest choice of each request, in tokens.", TOKEN_BUCKETS)
        self.iteration_tokens_total = histogram("iteration_tokens_total", "Tokens computed per engine step.",
                                                [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between output tokens.", ITL_BUCKETS)
        # The older name of the same per-token series, still read by vLLM's dashboards and alerts.
        self.time_per_output_token = histogram("time_per_output_token_seconds", "Time per output token (the same "
                                               "observations as inter_token_latency_seconds).", ITL_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "End-to-end request latency.",
                                             LATENCY_BUCKETS)
        self.request_queue_time = histogram("request_queue_time_seconds", "Time spent waiting.", LATENCY_BUCKETS)
        self.request_inference_time = histogram("request_inference_time_seconds", "Time spent running.",
                                                LATENCY_BUCKETS)
        self.request_prefill_time = histogram("request_prefill_time_seconds", "Time spent in prefill.", LATENCY_BUCKETS)
        self.request_decode_time = histogram("request_decode_time_seconds", "Time spent in decode.", LATENCY_BUCKETS)

    def set_components(self, components: dict[str, str]) -> None:
        """Publish each plugin component's state (``report_components``): 1 in use, 0 missing (a fallback)."""
        available = prom.Gauge(f"{self.prefix}:component_available", "Optional plugin components: 1 in use, 0 "
                               "missing (the plugin fell back; the log and kc plugins say why).",
                               ["model_name", "component"], registry=self.registry)
        for component, status in components.items():
            available.labels(model_name=self._model_name, component=component).set(status.startswith("ok"))

    def record(self, stats: EngineStats) -> None:
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.kv_cache_usage_perc.set(stats.kv_cache_usage)
        # (a counter's inc takes a lock: the zero ones, most of them most steps, are skipped)
        for metric, value in ((self.prompt_tokens, stats.num_prompt_tokens),
                              (self.generation_tokens, stats.num_generation_tokens),
                              (self.num_preemptions, stats.num_preemptions),
                              (self.prefix_cache_queries, stats.num_prefix_cache_queries),
                              (self.prefix_cache_hits, stats.num_prefix_cache_hits)):
            if value:
                metric.inc(value)
        if stats.spec_num_drafts:
            self.spec_num_drafts.inc(stats.spec_num_drafts)
            self.spec_num_draft_tokens.inc(stats.spec_num_draft_tokens)
            self.spec_num_accepted_tokens.inc(stats.spec_num_accepted_tokens)
            for position, count in enumerate(stats.spec_accepted_per_pos):
                self._spec_per_pos.labels(model_name=self._model_name, position=str(position)).inc(count)
        labels = (self._lora_labels[0], ",".join(sorted(stats.running_lora_adapters)),
                  ",".join(sorted(stats.waiting_lora_adapters)))
        if labels != self._lora_labels:  # one series: the current adapters, valued with the time they were seen
            self._lora_info.remove(*self._lora_labels)
            self._lora_labels = labels
            self._lora_series = self._lora_info.labels(*labels)
        self._lora_series.set(stats.timestamp or 0)
        num_tokens = stats.num_prompt_tokens + stats.num_generation_tokens
        for step_tokens in stats.iteration_tokens or ([num_tokens] if num_tokens else []):
            self.iteration_tokens_total.observe(step_tokens)

    def record_finished(self, request: FinishedRequestStats) -> None:
        reason = request.finish_reason if request.finish_reason in self.request_success else "abort"
        self.request_success[reason].inc()
        self.request_prompt_tokens.observe(request.num_prompt_tokens)
        self.request_generation_tokens.observe(request.num_generation_tokens)
        self.request_params_n.observe(request.n)
        if request.max_tokens is not None:
            self.request_params_max_tokens.observe(request.max_tokens)
        self.request_max_num_generation_tokens.observe(request.num_generation_tokens / max(request.n, 1))
        self.time_to_first_token.observe(request.time_to_first_token)
        for latency in request.inter_token_latencies:
            self.inter_token_latency.observe(latency)
            self.time_per_output_token.observe(latency)
        self.e2e_request_latency.observe(request.e2e_latency)
        self.request_queue_time.observe(request.queue_time)
        self.request_inference_time.observe(request.prefill_time + request.decode_time)
        self.request_prefill_time.observe(request.prefill_time)
        self.request_decode_time.observe(request.decode_time)

    def generate_latest(self) -> bytes:
        return prom.generate_latest(self.registry)
