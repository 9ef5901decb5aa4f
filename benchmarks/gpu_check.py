"""The Python half of benchmarks/gpu_check.sh: parity, `kc serve` with the openai client, then gpu_perf.py.

    python benchmarks/gpu_check.py OUT_DIR            on a GPU (the CUDA platform)
    python benchmarks/gpu_check.py OUT_DIR --smoke    the same code paths on the CPU, tiny shapes

Each section records its numbers, or its error, in OUT_DIR/results.json (rewritten after every section), so
a failing or timed-out section leaves the others' results. Nothing here asserts: the JSON is the report.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), HERE]
from gpu_perf import free_memory, perf  # noqa: E402

PROMPTS = [[5, 9, 11, 3, 7, 8, 100, 200, 17], list(range(40, 71)), [3, 4]]
NUM_TOKENS = 16


class Report:
    def __init__(self, out_dir: str) -> None:
        self.path = os.path.join(out_dir, "results.json")
        self.data: dict = {"errors": {}}

    def section(self, name: str, fn, *args) -> None:
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            self.data[name] = fn(*args)
        except Exception:
            self.data["errors"][name] = traceback.format_exc(limit=6)
            print(self.data["errors"][name], flush=True)
        self.data.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=2, default=str)


def enable_cpu_graph_double() -> None:
    """Smoke runs: lend the CPU platform the test double of decode graphs, so the graph path runs there too."""
    from kernelcore import hookimpl, plugins

    class GraphsOnCpu:
        @hookimpl
        def get_graph_capture_backend_cls(self, config):
            return "kc_dummy_triton_interp.graphs.RerunCaptureBackend"

    plugins.get_plugin_manager().register(GraphsOnCpu(), name="gpu-check-graphs-on-cpu")


def hf_reference(path: str, device: str, runs: dict) -> dict:
    """Greedy tokens of transformers (fp32, one forward per token) and, along each kernelcore trajectory, the
    log-probability transformers gives the token kernelcore sampled."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    greedy, logprobs = [], {mode: [] for mode in runs}
    with torch.inference_mode():
        for i, prompt in enumerate(PROMPTS):
            ids = list(prompt)
            for _ in range(NUM_TOKENS):
                ids.append(int(hf(torch.tensor([ids], device=device)).logits[0, -1].argmax()))
            greedy.append(ids[len(prompt):])
            for mode, run in runs.items():
                tokens = run["tokens"][i]
                full = torch.tensor([list(prompt) + tokens], device=device)
                lp = hf(full).logits[0].float().log_softmax(-1)
                positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens), device=device)
                logprobs[mode].append(lp[positions, torch.tensor(tokens, device=device)].tolist())
    del hf
    free_memory()
    return {"greedy": greedy, "logprobs": logprobs}


def run_kernelcore_tiny(path: str, eager: bool) -> dict:
    from kernelcore import LLM, SamplingParams

    llm = LLM(path, dtype="float32", enforce_eager=eager, kv_cache_memory=256 << 20, max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    graphs = llm.engine_core.executor.worker.model_runner.graph_runner
    run = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
           "logprobs": [[step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)]
                        for o in outs],
           "graph_replays": None if graphs is None else graphs.num_replays}
    llm.shutdown()
    del llm
    free_memory()
    return run


def parity(device: str, root: str, smoke: bool) -> dict:
    """Every architecture conftest_models can build (smoke runs: Llama and OPT): greedy tokens and logprobs
    against transformers, fp32, with decode graphs (the default) and with enforce_eager."""
    import conftest_models

    makers = {n[len("make_"):-len("_checkpoint")]: getattr(conftest_models, n) for n in sorted(dir(conftest_models))
              if n.startswith("make_") and n.endswith("_checkpoint")}
    for arch in getattr(conftest_models, "ARCH_DEFAULTS", {}):  # the generic maker's architectures, if any
        makers.setdefault(arch, functools.partial(conftest_models.make_checkpoint, arch))
    if smoke:  # the CPU suite checks every architecture's parity itself
        makers = {name: makers[name] for name in ("llama", "opt")}
    report = {}
    for name, make in makers.items():
        path = make(os.path.join(root, name))
        runs, arch = {}, {}
        for mode in ("graphs", "eager"):  # one failing mode still leaves the other's figures
            try:
                runs[mode] = run_kernelcore_tiny(path, eager=mode == "eager")
            except Exception:
                arch[mode] = {"error": traceback.format_exc(limit=6)}
                print(arch[mode]["error"], flush=True)
        if not runs:
            report[name] = arch
            continue
        ref = hf_reference(path, device, runs)
        total = sum(len(w) for w in ref["greedy"])
        if len(runs) == 2:
            arch["graphs_equal_eager_tokens"] = runs["graphs"]["tokens"] == runs["eager"]["tokens"]
        for mode, run in runs.items():
            arch[mode] = {
                "greedy_token_match": sum(a == b for g, w in zip(run["tokens"], ref["greedy"], strict=False)
                                          for a, b in zip(g, w, strict=False)) / total,
                "max_logprob_abs_diff": max(abs(a - b)
                                            for g, w in zip(run["logprobs"], ref["logprobs"][mode], strict=False)
                                            for a, b in zip(g, w, strict=False)),
                "graph_replays": run["graph_replays"]}
        report[name] = arch
        print(f"parity {name}: {json.dumps(arch)}", flush=True)
    return report


def serve(smoke: bool, out_dir: str) -> dict:
    """`kc serve` (the embedded default model, bf16 on a GPU) answering the official openai client."""
    import openai
    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", "--port", str(port), "--max-model-len", "512",
            "--kv-cache-memory", "512MiB", "--shutdown-timeout", "2", *([] if smoke else ["--dtype", "bfloat16"])]
    with open(os.path.join(out_dir, "serve.log"), "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kc serve exited ({proc.returncode}): see serve.log")
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.time() > deadline:
                raise RuntimeError("kc serve did not become healthy in 240 s: see serve.log")
            time.sleep(0.5)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": "Tell me about graphics processors."}]
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                                stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        two = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, n=2, temperature=1.0,
                                        seed=1)
        lp = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=2)
        content = lp.choices[0].logprobs.content
        return {
            "chat_ok": bool(chat.choices[0].message.content) and chat.choices[0].finish_reason == "length",
            "chat_completion_tokens": chat.usage.completion_tokens,
            "stream_equals_chat": streamed == chat.choices[0].message.content,
            "n2_ok": sorted(c.index for c in two.choices) == [0, 1] and all(c.text for c in two.choices),
            "logprobs_ok": len(content) == 8 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content),
            "sample": chat.choices[0].message.content,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    out_dir, smoke = sys.argv[1], "--smoke" in sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    device = "cpu" if smoke else "cuda"
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("torch sees no GPU: run with --smoke on the CPU")
    report = Report(out_dir)
    report.data.update(gpu="cpu (smoke run)" if smoke else torch.cuda.get_device_name(), torch=torch.__version__,
                       date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), smoke=smoke)
    tests_log = os.path.join(out_dir, "tests.txt")
    if os.path.exists(tests_log):  # the native kernel and graph tests gpu_check.sh ran before this script
        with open(tests_log) as f:
            report.data["native_tests"] = (f.read().strip().splitlines() or [""])[-1]
    if smoke:
        enable_cpu_graph_double()
    root = tempfile.mkdtemp(prefix="kc-gpu-check-")
    sections = os.environ.get("KC_GPU_CHECK_SECTIONS", "parity,serve,perf").split(",")
    for name, fn, args in (("parity", parity, (device, root, smoke)), ("serve", serve, (smoke, out_dir)),
                           ("perf", perf, (device, smoke, root))):
        if name in sections:
            report.section(name, fn, *args)
    print(json.dumps(report.data, indent=2, default=str))
    print("\n".join(summary(report.data)))


def summary(data: dict) -> list[str]:
    """The short table the device tool's reply ends with (the full numbers are in results.json)."""
    lines = [f"GPU check on {data['gpu']} ({data['date']}); errors in: {sorted(data['errors']) or 'none'}",
             f"native tests: {data.get('native_tests', 'not run')}"]
    for arch, modes in (data.get("parity") or {}).items():
        cells = [f"{m} match {r['greedy_token_match']:.0%} dlogprob {r['max_logprob_abs_diff']:.1e}"
                 if "error" not in r else f"{m} ERROR" for m, r in modes.items() if isinstance(r, dict)]
        lines.append(f"parity {arch}: " + "; ".join(cells))
    if data.get("serve"):
        lines.append("serve: " + " ".join(f"{k}={v}" for k, v in data["serve"].items() if k != "sample"))
    figures = data.get("perf") or {}
    for mode in ("graphs", "eager", "transformers"):
        r = figures.get(mode) or {}
        if "error" in r:
            lines.append(f"{mode}: ERROR")
            continue
        tps = " ".join(f"{w} {r[f'{w}_tokens_per_s']:.0f} tok/s" for w in ("uniform", "mixed")
                       if f"{w}_tokens_per_s" in r)
        steps = " ".join(f"b{k[len('decode_batch'):]} {v['step_ms']:.2f} ms (matmuls {v['matmul_share']:.0%})"
                         for k, v in r.items() if k.startswith("decode_batch"))
        memory = r.get("memory") or {}
        peak = f" peak {memory['peak_allocated_gib']:.2f} GiB" if memory.get("peak_allocated_gib") else ""
        lines.append(f"{mode}: {tps} {steps}{peak}".rstrip())
    for k, v in (figures.get("ratios") or {}).items():
        lines.append(f"  {k}: {v:.2f}x")
    return lines


if __name__ == "__main__":
    main()
