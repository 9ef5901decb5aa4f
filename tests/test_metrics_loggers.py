"""Stat loggers as plugins: discovery, validation, and the built-in logging logger."""

import json
import os

import pytest
from helpers import run_python

from kernelcore.metrics import StatLoggerBase, validate_stat_loggers
from kernelcore.metrics.logging_logger import LoggingStatLogger
from kernelcore.metrics.stats import EngineStats


def test_stat_logger_plugin_is_discovered_through_its_entry_point():
    out = run_python("""
        from kernelcore.metrics import load_stat_logger_plugins
        print([c.__name__ for c in load_stat_logger_plugins()])
    """).stdout
    assert out.strip() == "['DummyStatLogger']"


def test_a_stat_logger_plugin_that_is_not_a_subclass_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="Stat logger plugin 'bad' must be a subclass"):
        validate_stat_loggers([("bad", object())])
    assert validate_stat_loggers([("good", StatLoggerBase)]) == [StatLoggerBase]


def test_blocked_stat_logger_plugin_is_not_loaded():
    out = run_python("""
        from kernelcore.metrics import load_stat_logger_plugins
        print(len(load_stat_logger_plugins()))
    """, KC_BLOCK_PLUGINS="dummy_stat_logger").stdout
    assert out.strip() == "0"


def test_logging_logger_reports_throughput_queue_and_kv_usage():
    stat_logger = LoggingStatLogger()
    stat_logger.since = 0.0
    assert stat_logger.format_line(1.0) is None  # nothing happened: no line
    stat_logger.record(EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.25, num_prompt_tokens=100,
                                   num_generation_tokens=30, num_prefix_cache_queries=100, num_prefix_cache_hits=50))
    line = stat_logger.format_line(2.0)
    assert "Avg prompt throughput: 50.0 tokens/s" in line and "Avg generation throughput: 15.0 tokens/s" in line
    assert "Running: 3 reqs, Waiting: 2 reqs" in line and "KV cache usage: 25.0%" in line
    assert "Prefix cache hit rate: 50.0%" in line


@pytest.mark.slow  # spawns an engine core
def test_engine_feeds_every_stat_logger_each_step(tmp_path):
    stat_file = tmp_path / "stats.jsonl"
    run_python("""
        import asyncio
        from kernelcore.config_builder import build_config
        from kernelcore.engine.async_llm import AsyncLLM
        from kernelcore.core_types.sampling_params import SamplingParams
        from kernelcore.metrics import make_stat_loggers

        async def main():
            config = build_config(kv_cache_memory=1 << 24)
            llm = await AsyncLLM.create(config, stat_loggers=make_stat_loggers(config))
            async for _ in llm.generate("r", [5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True)):
                pass
            await llm.shutdown()
            print([type(s).__name__ for s in llm.stat_loggers])

        if __name__ == "__main__":
            asyncio.run(main())
    """, KC_DUMMY_STAT_FILE=str(stat_file))
    lines = [json.loads(line) for line in stat_file.read_text().splitlines()]
    assert len(lines) >= 8 and lines[-1]["num_records"] == len(lines)
    assert {line["pid"] for line in lines} == {lines[0]["pid"]} != os.getpid()


def test_environment_is_frozen_after_start_up(monkeypatch):
    from kernelcore import envs

    monkeypatch.setenv("KC_PLUGINS", "a")
    assert envs.KC_PLUGINS == ["a"]
    envs.freeze()
    try:
        monkeypatch.setenv("KC_PLUGINS", "b, c")
        assert envs.KC_PLUGINS == ["a"] and envs.is_frozen()
    finally:
        envs.unfreeze()
    assert envs.KC_PLUGINS == ["b", "c"]
