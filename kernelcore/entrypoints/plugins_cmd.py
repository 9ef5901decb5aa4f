"""`kc plugins`: what is installed, what loaded, who owns what, which platform wins and why."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from typing import Any

import click


def collect() -> dict[str, Any]:
    from kernelcore import platforms, plugins
    from kernelcore.models.registry import model_registry

    report: dict[str, Any] = {"platform": None, "errors": []}
    detections = []
    try:
        detections = platforms.detect_all()
        winner, why = platforms.choose(detections)
        report["platform"] = {"name": winner.name, "class": winner.qualname, "why": why}
    except Exception as exc:
        report["errors"].append(f"platform: {exc}")
    report["detections"] = [dataclasses.asdict(d) for d in detections]
    if report["platform"] is not None:
        try:
            platforms.load_general_plugins()
        except Exception as exc:
            report["errors"].append(str(exc))
    try:
        plugins.load_stat_logger_classes()
    except Exception as exc:
        report["errors"].append(str(exc))
    report["plugins"] = [dataclasses.asdict(r) for r in plugins.records()]
    report["models"] = model_registry.owners()
    report["structured_output_backends"], report["tool_parsers"], report["reasoning_parsers"] = {}, [], []
    if report["platform"] is not None and not report["errors"]:
        from kernelcore.entrypoints.reasoning_parsers import reasoning_parser_registry
        from kernelcore.entrypoints.tool_parsers import tool_parser_registry
        from kernelcore.structured_output.backend import build_registry

        try:
            report["structured_output_backends"] = build_registry().owners()
            report["tool_parsers"] = tool_parser_registry().names()
            report["reasoning_parsers"] = reasoning_parser_registry().names()
        except Exception as exc:
            report["errors"].append(f"parsers and grammar backends: {exc}")
    report.update(ops={}, kernels={}, components={})
    if platforms.is_resolved() and report["platform"] is not None:
        _add_components(report)
        report["components"] = plugins.report_components()
    return report


def _add_components(report: dict[str, Any]) -> None:
    """The platform class's hooks, the ops plugins replaced, and the kernel table as a worker would see it."""
    from kernelcore import plugins
    from kernelcore.custom_op import op_registry_oot
    from kernelcore.kernels import kernel_table
    from kernelcore.platforms import Platform, current_platform

    cls = type(current_platform)
    report["platform"]["hooks"] = sorted(
        name for name in dir(cls) if hasattr(getattr(cls, name), "kernelcore_impl")
        and getattr(cls, name) is not getattr(Platform, name, None))
    owners = plugins.op_owners()
    for key, replacement in sorted(op_registry_oot.items()):
        owner = owners.get(key, "?")
        report["ops"][key] = {"class": f"{replacement.__module__}.{replacement.__qualname__}", "plugin": owner}
    try:
        plugins.apply_kernel_overrides()
    except Exception as exc:
        report["errors"].append(f"register_triton_kernel_overrides: {exc}")
    report["kernels"] = kernel_table.winners()


@click.group("plugins", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def plugins_cmd(ctx: click.Context, as_json: bool) -> None:
    """List every discovered plugin, its status and hooks, and the winning platform."""
    if ctx.invoked_subcommand is not None:
        return
    report = collect()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    by_group: dict[str, list[dict]] = defaultdict(list)
    for record in report["plugins"]:
        by_group[record["group"]].append(record)
    for group, records in by_group.items():
        click.echo(f"[{group}]")
        for r in records:
            origin = "built-in" if r["is_builtin"] else "third-party"
            click.echo(f"  {r['name']:<24} {r['status']:<11} {r['dist']} {r['version']} ({origin}) -> {r['value']}")
            if r["hooks"]:
                click.echo(f"  {'':<24} hooks: {', '.join(r['hooks'])}")
            if r["error"]:
                click.echo(f"  {'':<24} error: {r['error']}")
    click.echo("[platform detection]")
    for d in report["detections"]:
        state = d["qualname"] or (f"error: {d['error']}" if d["error"] else "inactive")
        click.echo(f"  {d['name']:<24} {state}")
    if report["platform"]:
        p = report["platform"]
        click.echo(f"  => {p['name']} ({p['class']}): {p['why']}")
        if p.get("hooks"):
            click.echo(f"     hooks: {', '.join(p['hooks'])}")
    if report["ops"]:
        click.echo("[replaced ops]")
        for key, op in report["ops"].items():
            click.echo(f"  {key:<32} {op['class']} (plugin {op['plugin']})")
    if report["kernels"]:
        click.echo("[kernel table: the implementation a worker runs]")
        for name, winner in report["kernels"].items():
            click.echo(f"  {name:<32} {winner}")
    if report["components"]:
        click.echo("[components: ok = in use, missing = fallen back]")
        for name, status in report["components"].items():
            click.echo(f"  {name:<32} {status}")
    if report["models"]:
        click.echo("[models]")
        for arch, owner in report["models"].items():
            click.echo(f"  {arch:<32} plugin {owner}")
    if report["structured_output_backends"]:
        click.echo("[structured-output backends] (auto tries them in this order)")
        for name, owner in report["structured_output_backends"].items():
            click.echo(f"  {name:<32} plugin {owner}")
    if report["tool_parsers"] or report["reasoning_parsers"]:
        click.echo(f"[tool-call parsers] {', '.join(report['tool_parsers'])}")
        click.echo(f"[reasoning parsers] {', '.join(report['reasoning_parsers'])}")
    for error in report["errors"]:
        click.echo(f"error: {error}", err=True)


@plugins_cmd.command("check")
@click.argument("name")
@click.option("--model", default=None, help="Checkpoint for the greedy-token check [default: the embedded model].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check_cmd(name: str, model: str | None, as_json: bool) -> None:
    """Run the conformance kit against the installed platform plugin NAME (its device must be present)."""
    from kernelcore.conformance import run_checks

    results = run_checks(name, model)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        for r in results:
            click.echo(f"{'PASS' if r.ok else 'FAIL'}  {r.name}: {r.detail}")
    if not all(r.ok for r in results):
        raise SystemExit(1)


@plugins_cmd.command("tour")
@click.argument("trace_file", type=click.Path(exists=True, dir_okay=False))
def tour_cmd(trace_file: str) -> None:
    """Render a KC_TRACE_PLUGINS file as a per-process timeline."""
    click.echo(render_tour(trace_file))


def render_tour(trace_file: str) -> str:
    events = [json.loads(line) for line in open(trace_file) if line.strip()]
    if not events:
        return "(empty trace)"
    t0 = min(e["time"] for e in events)
    by_process: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for event in events:
        by_process[(event["pid"], event["role"])].append(event)
    lines = []
    for number, ((pid, role), proc_events) in enumerate(sorted(by_process.items(), key=lambda kv: kv[1][0]["time"]), 1):
        lines.append(f"{number}. {role} (pid {pid})")
        for e in sorted(proc_events, key=lambda e: e["time"]):
            who = ",".join(e.get("plugins", [])) or "-"
            mark = "" if e.get("ok", True) else "  FAILED"
            lines.append(f"   +{e['time'] - t0:8.3f}s  {e['hook']:<34} {who:<28} {e.get('duration_ms', 0):8.2f} ms"
                         f"  -> {e.get('result', '')}{mark}")
    return "\n".join(lines)
