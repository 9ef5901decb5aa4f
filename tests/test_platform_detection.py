"""Platform detection through real entry points (the dummy platform package is pip-installed)."""

import json

import pytest
from helpers import run_kc, run_python

SHOW = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from kernelcore.platforms import current_platform as p
print(type(p).__name__, p.device_name, p.plugin_name, p.is_out_of_tree())
"""


def test_import_kernelcore_resolves_nothing():
    out = run_python("""
        import sys, kernelcore, kernelcore.platforms as p, kernelcore.plugins as pl
        assert not p.is_resolved()
        assert 'torch' not in sys.modules, 'import kernelcore must stay cheap'
        print(type(p.current_platform).__name__, p.is_resolved())
    """).stdout
    assert out.split() == ["CpuPlatform", "True"]


def test_builtin_cpu_platform_without_vendor_device():
    out = run_python(SHOW).stdout.split()
    assert out == ["CpuPlatform", "cpu", "cpu", "False"]


def test_out_of_tree_platform_wins_over_builtins():
    proc = run_python(SHOW, KC_DUMMY_DEVICE="1")
    assert proc.stdout.split() == ["DummyPlatform", "DummyDevice", "dummy_platform", "True"]
    assert "Platform plugin dummy_platform is activated" in proc.stderr


def test_two_active_out_of_tree_platforms_is_an_error_naming_both():
    proc = run_python(SHOW, check=False, KC_DUMMY_DEVICE="1", KC_DUMMY_SECOND_DEVICE="1")
    assert proc.returncode != 0
    assert "Only one out-of-tree platform plugin can be active" in proc.stderr
    assert "dummy_platform" in proc.stderr and "dummy_platform_b" in proc.stderr


def test_raising_detector_is_logged_with_its_name_and_inactive():
    proc = run_python(SHOW, KC_DUMMY_BROKEN_DETECTOR="1")
    assert proc.stdout.split()[0] == "CpuPlatform"
    assert "dummy_broken_platform" in proc.stderr and "dummy detector exploded" in proc.stderr


def test_kc_platform_forces_a_platform_by_name():
    assert run_python(SHOW, KC_DUMMY_DEVICE="1", KC_PLATFORM="cpu").stdout.split()[0] == "CpuPlatform"
    proc = run_python(SHOW, check=False, KC_PLATFORM="nonexistent")
    assert proc.returncode != 0 and "KC_PLATFORM=nonexistent" in proc.stderr


def test_block_plugins_blocks_a_platform_before_loading():
    out = run_python(SHOW + """
from kernelcore import plugins
print({r.name: r.status for r in plugins.records()}['dummy_platform'])
""", KC_DUMMY_DEVICE="1", KC_BLOCK_PLUGINS="dummy_platform, cuda").stdout.split()
    assert out[0] == "CpuPlatform" and out[-1] == "blocked"


def test_allow_list_filters_third_party_only_and_strips_whitespace():
    proc = run_python("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        from kernelcore import platforms, plugins
        platforms.load_general_plugins()
        print(sorted((r.name, r.status) for r in plugins.records()))
    """, KC_PLUGINS=" dummy_ops , no_such_plugin ")
    statuses = dict(eval(proc.stdout))
    assert statuses["models"] == "loaded" and statuses["cpu"] == "loaded"  # built-ins always load
    assert statuses["dummy_ops"] == "loaded"
    assert statuses["dummy_platform"] == "not-allowed" and statuses["dummy_custom_ops"] == "not-allowed"
    assert "no_such_plugin" in proc.stderr  # unknown allow-list names warn


@pytest.mark.slow
def test_platform_leaving_worker_cls_auto_is_a_clear_error(tmp_path):
    proc = run_python("""
        from kernelcore.config_builder import build_config
        build_config()
    """, check=False, KC_DUMMY_DEVICE="1", KC_DUMMY_LEAVE_AUTO="1", KC_CACHE_DIR=str(tmp_path))
    assert proc.returncode != 0
    assert "dummy_platform" in proc.stderr and "check_and_update_config" in proc.stderr and "worker_cls" in proc.stderr


@pytest.mark.slow
def test_kc_plugins_lists_builtins_and_dummies_with_the_winner():
    report = json.loads(run_kc("plugins", "--json", KC_DUMMY_DEVICE="1").stdout)
    names = {(r["group"], r["name"]): r for r in report["plugins"]}
    assert names[("kernelcore.platform_plugins", "cpu")]["is_builtin"]
    assert names[("kernelcore.general_plugins", "models")]["is_builtin"]
    assert not names[("kernelcore.platform_plugins", "dummy_platform")]["is_builtin"]
    assert names[("kernelcore.stat_logger_plugins", "dummy_stat_logger")]["status"] == "loaded"
    assert "register_ops" in names[("kernelcore.general_plugins", "dummy_custom_ops")]["hooks"]
    assert report["platform"]["name"] == "dummy_platform" and "out-of-tree" in report["platform"]["why"]
    text = run_kc("plugins").stdout
    assert "dummy_platform" in text and "=> cpu" in text
