"""`kc serve` / `kc bench` command lines (no server started here)."""

import click
import pytest
from click.testing import CliRunner
from helpers import run_kc

from kernelcore.entrypoints.serve import parse_size


def test_serve_help_lists_flags_and_env_vars():
    out = run_kc("serve", "--help").stdout
    for flag in ("--host", "--port", "--tensor-parallel-size", "--max-model-len", "--block-size", "--max-num-seqs",
                 "--max-num-batched-tokens", "--kv-cache-memory", "--dtype", "--hf-overrides", "--chat-template",
                 "--served-model-name", "--api-key", "--enable-prefix-caching", "--no-enable-prefix-caching", "--seed",
                 "--max-request-body-bytes", "--max-n", "--max-logprobs", "--max-stop-strings",
                 "--trust-request-chat-template", "--enable-endpoint-plugins", "--shutdown-timeout", "--enforce-eager"):
        assert flag in out, flag
    assert "KC_API_KEY" in out and "127.0.0.1" in out


def test_serve_help_explains_the_operator_flags():
    out = " ".join(run_kc("serve", "--help").stdout.split())
    assert "--default-max-tokens" in out and "Without it a chat request generates until the model stops" in out
    assert "--metrics-prefix" in out and "`vllm` makes vLLM's dashboards" in out
    assert "--no-web-console" in out


def test_bad_metrics_prefix_is_a_usage_error():
    from kernelcore.entrypoints.serve import serve_cmd

    result = CliRunner().invoke(serve_cmd, ["--metrics-prefix", "bad prefix!"])
    assert result.exit_code == 2 and "--metrics-prefix" in result.output


def test_platform_can_add_serve_options():
    out = run_kc("serve", "--help", KC_DUMMY_DEVICE="1").stdout
    assert "--dummy-flag" in out


@pytest.mark.slow
def test_platform_option_value_reaches_the_platform_through_the_config():
    proc = run_kc("serve", "--dummy-flag", "refuse", "--port", "0", check=False, KC_DUMMY_DEVICE="1")
    assert proc.returncode != 0 and "DummyPlatform refuses --dummy-flag=refuse" in proc.stderr


@pytest.mark.parametrize("args, eager", [(["--enforce-eager"], True), ([], False)])
def test_enforce_eager_reaches_the_config(monkeypatch, args, eager):
    """The flag's value in the real config serve builds (stopped right after, before any engine starts)."""
    import kernelcore.config_builder as config_builder
    from kernelcore.entrypoints.serve import serve_cmd

    real, built = config_builder.build_config, []

    def build_then_stop(**kwargs):
        built.append(real(**kwargs))
        raise click.Abort()

    monkeypatch.setattr(config_builder, "build_config", build_then_stop)
    result = CliRunner().invoke(serve_cmd, args)
    assert result.exit_code != 0 and len(built) == 1
    assert built[0].model.enforce_eager is eager


def test_bench_mounts_serve_and_throughput():
    out = run_kc("bench", "--help").stdout
    assert "serve" in out and "throughput" in out


def test_bad_hf_overrides_is_a_usage_error():
    from kernelcore.entrypoints.serve import serve_cmd

    result = CliRunner().invoke(serve_cmd, ["--hf-overrides", "[1]"])
    assert result.exit_code == 2 and "JSON object" in result.output


@pytest.mark.parametrize("text,expected", [("1048576", 1 << 20), ("2GiB", 2 << 30), ("512MB", 512_000_000),
                                           ("8MiB", 8 << 20), ("1.5KiB", 1536)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_rejects_garbage():
    with pytest.raises(click.BadParameter):
        parse_size("lots")


def test_a_max_model_len_past_the_models_positions_is_a_one_line_error(tmp_path):
    """Refused before any engine starts: the reason on one line, exit status 1, no traceback (a request past the
    positions used to take the engine down once the server was up)."""
    from conftest_models import make_llama_checkpoint

    path = make_llama_checkpoint(str(tmp_path / "m"))  # 256 positions
    proc = run_kc("serve", path, "--max-model-len", "512", "--skip-tokenizer-init", "--port", "0", check=False)
    assert proc.returncode == 1
    assert "Error: max_model_len 512 is longer than the 256 positions LlamaForCausalLM encodes" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag", ["--max-model-len", "--block-size", "--max-num-seqs", "--max-num-batched-tokens"])
def test_a_size_below_one_is_a_usage_error(flag):
    """Named at the command line (a negative --max-num-seqs used to fail in the engine, about the KV cache)."""
    from kernelcore.entrypoints.serve import serve_cmd

    result = CliRunner().invoke(serve_cmd, [flag, "0"])
    assert result.exit_code == 2 and flag in result.output
