"""The CI-sized soak: benchmarks/soak.py's run, 3 minutes of mixed traffic at 80% of the measured capacity.

One real `kc serve` (the embedded default model, a PEFT LoRA adapter, the hermes tool-call parser); the mix is
soak.MIX: streamed chat, completions, clients that disconnect mid-stream, n=2, json_schema, the LoRA model, tool
calls (auto and required) and bad requests. The bounds do not depend on the machine's speed: the capacity is
measured here and now (a slower machine sends fewer requests, or queues them, but the checks are the same), no
latency is asserted, and the waits are nets (a request may take minutes on a busy machine).

The memory bound: the resident memory of the server's process tree may grow by at most RSS_GROWTH_BOUND_MIB from
the end of the capacity phase (warm: every kind has run at saturation) to after the drain, both idle. The part
that may legitimately grow is bounded by the configuration: the KV cache is allocated zeroed and lazily
(calloc), so its pages become resident as blocks are first written, at most its 64 MiB (`--kv-cache-memory`),
and the Python heaps settle within tens of MiB (measured: see docs/performance.md, "Soak: 30 minutes of mixed
traffic"). A leak of a few KiB per request (some 4000 requests here) would pass unnoticed; one of 50 KiB per
request would not.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import soak  # noqa: E402

# a real server for minutes: run with the full suite; alone, so that its capacity phase measures the server and
# the load it then sends stays at 80% of what the machine gives it
pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

MINUTES = 3
RSS_GROWTH_BOUND_MIB = 200


@pytest.mark.timeout(1200)  # a net for a hang only: a busy machine queues requests, the run then takes longer
def test_three_minute_soak(tmp_path):
    result = soak.soak(minutes=MINUTES, capacity_seconds=15, concurrency=16, window_minutes=1, sample_seconds=2,
                       work_dir=str(tmp_path), plot=str(tmp_path / "soak-memory.svg"), request_timeout=600,
                       drain_timeout=300, log=print)
    with open(tmp_path / "soak.json", "w") as f:
        json.dump(result, f, indent=1)
    run = result["soak"]
    print(json.dumps({k: result[k] for k in ("capacity_rps", "rate_rps", "windows", "drain", "checks")}, indent=1))
    print({k: v for k, v in result["rss_mib"].items() if k != "series"})
    failures = [r for part in ("warm_up", "capacity_phase", "soak") for r in result[part]["first_failures"]]

    assert result["capacity_rps"] > 0 and run["requests"] > 0
    assert set(run["by_kind"]) == set(soak.MIX), run["by_kind"]  # every kind of the mix was sent
    for part in ("warm_up", "capacity_phase", "soak"):
        counts = result[part]
        assert counts["num_5xx"] == 0, failures
        assert counts["good_ok"] == counts["good"], failures  # every good request complete and well-formed
        assert counts["bad_4xx"] == counts["bad"], failures  # every bad one answered 4xx with an error body
    assert result["drain"]["idle"] and result["drain"]["idle_after_capacity"], result["drain"]
    assert result["drain"]["running"] == 0 and result["drain"]["waiting"] == 0
    assert not result["server_log_problems"], result["server_log_problems"]
    assert result["ok"], result["checks"]
    growth = result["rss_mib"]["growth_warm_to_end"]
    assert growth < RSS_GROWTH_BOUND_MIB, (growth, result["rss_mib"]["by_process"])
