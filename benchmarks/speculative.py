"""Plain decoding vs n-gram speculative decoding in kc serve, same run, on a real model.

    python benchmarks/speculative.py                             # SmolLM2-135M-Instruct Q4_1 (kc pull), 3 runs
    python benchmarks/speculative.py --spec '{"method": "ngram", "num_speculative_tokens": 6}' --num-runs 5

Two servers stay up (the idle one takes no CPU): one plain, one with --speculative-config. Each prompt runs on
the plain server, then at once on the speculative one, run after run, one request at a time (greedy, the model's
own stop), so a drift in the machine's speed hits both alike. Two sets: input-grounded (edit this code, correct
this email, quote the context: the answer copies the prompt) and free generation (the answer copies nothing).
Printed per set: median tokens/s of each server (output tokens over the whole request, prefill included), the
median per-prompt speed ratio, the same ratio after the first token (the prompt's prefill, which speculation
cannot change, left out: the requests are streamed and timed from the first token to the last), and the
acceptance rate from the speculative server's /metrics. The two servers' answers must be identical (greedy); a
difference is printed. Never part of CI.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

import click
import requests

CODE = '''def count_words(text):
    counts = {}
    for word in text.split():
        word = word.lower().strip(".,!?")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts


def top_words(text, n):
    counts = count_words(text)
    ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    return ranked[:n]
'''
CONFIG = '''server:
  host: 127.0.0.1
  port: 8080
  workers: 4
logging:
  level: info
  file: /var/log/app.log
database:
  url: postgres://db.internal:5432/app
  pool_size: 10
'''
EMAIL = ("Hi team,\n\nI wanted to let you know that the meeting on friday have been moved to monday at 10 am. "
         "Please let me know if you cant make it, and I will send the updated agenda tomorow.\n\nThanks,\nSam")
CONTEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
           "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. "
           "Locally nicknamed 'La dame de fer', it was constructed as the centrepiece of the 1889 World's Fair.")
GROUNDED = [
    f"Rename the function count_words to word_counts everywhere in this code. Reply with the full code only."
    f"\n\n```python\n{CODE}```",
    f"Correct the grammar and spelling of this email and return the whole email:\n\n{EMAIL}",
    f"Change the port to 9090 and the log level to debug in this YAML file. Reply with the whole file.\n\n{CONFIG}",
    f"Context: {CONTEXT}\n\nQuestion: Who is the Eiffel Tower named after? Quote the sentence from the context "
    "that answers.",
]
FREE = [
    "Write a short poem about the sea.",
    "Explain in a few sentences why the sky is blue.",
    "Give three tips for learning a new language.",
    "Tell a short story about a robot who learns to paint.",
]
DEFAULT_SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def start(model: str, flags: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", model, "--port", str(port),
                             "--served-model-name", "m", "--max-model-len", "4096", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"kc serve {' '.join(flags)} exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=5).ok:
                return proc
        except requests.ConnectionError:
            time.sleep(0.5)


def chat(url: str, prompt: str, max_tokens: int) -> tuple[str, int, float, float]:
    """(answer, tokens, seconds for the whole request, seconds from the first streamed token to the last)."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    parts, usage = [], None
    with requests.post(url + "/v1/chat/completions", json=body, timeout=900, stream=True) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[len(b"data: "):])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice["delta"].get("content"):
                    first = first if first is not None else time.perf_counter()
                    parts.append(choice["delta"]["content"])
    elapsed = time.perf_counter() - started
    assert usage is not None and first is not None, "no usage or no content in the stream"
    return "".join(parts), usage["completion_tokens"], elapsed, time.perf_counter() - first


def spec_counters(url: str) -> tuple[float, float]:
    text = requests.get(url + "/metrics", timeout=10).text
    found = dict(re.findall(r"^kc:spec_decode_(num_draft_tokens|num_accepted_tokens)_total\{[^}]*\} (\S+)", text,
                            flags=re.M))
    return float(found.get("num_draft_tokens", 0)), float(found.get("num_accepted_tokens", 0))


@click.command()
@click.option("--model", default=None, help="A .gguf file or checkpoint directory [default: SmolLM2 via kc pull].")
@click.option("--spec", default=DEFAULT_SPEC, show_default=True, help="The speculative server's --speculative-config.")
@click.option("--flags", default="", help="Extra kc serve flags for both servers.")
@click.option("--num-runs", default=3, show_default=True)
@click.option("--max-tokens", default=256, show_default=True)
@click.option("--port", default=8231, show_default=True)
def main(model: str | None, spec: str, flags: str, num_runs: int, max_tokens: int, port: int) -> None:
    if model is None:
        from kernelcore import model_fetch

        model = model_fetch.fetch("smollm2-135m-instruct-q4_1")
    plain_url, spec_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    servers = [start(model, flags.split(), port),
               start(model, [*flags.split(), "--speculative-config", spec], port + 1)]
    try:
        for url in (plain_url, spec_url):
            chat(url, "Hello!", 8)  # warm-up
        print(f"model {os.path.basename(model)}; speculative config {spec}; {num_runs} runs; max_tokens {max_tokens}")
        for name, prompts in (("input-grounded", GROUNDED), ("free generation", FREE)):
            plain_tps, spec_tps, ratios, decode_ratios = [], [], [], []
            drafts0, accepted0 = spec_counters(spec_url)
            for _ in range(num_runs):
                for prompt in prompts:
                    text_a, n_a, t_a, d_a = chat(plain_url, prompt, max_tokens)
                    text_b, n_b, t_b, d_b = chat(spec_url, prompt, max_tokens)
                    if text_a != text_b:
                        print(f"  DIFFERENT ANSWERS for {prompt[:40]!r}:\n    plain {text_a[:80]!r}\n"
                              f"    spec  {text_b[:80]!r}")
                    plain_tps.append(n_a / t_a)
                    spec_tps.append(n_b / t_b)
                    ratios.append((n_b / t_b) / (n_a / t_a))
                    if n_a > 1 and d_a > 0 and d_b > 0:  # after the first token: what speculation can change
                        decode_ratios.append(d_a / d_b)
            drafts1, accepted1 = spec_counters(spec_url)
            rate = (accepted1 - accepted0) / max(drafts1 - drafts0, 1)
            print(f"{name:16s} plain {statistics.median(plain_tps):6.1f} tok/s"
                  f"   ngram {statistics.median(spec_tps):6.1f} tok/s   ratio x{statistics.median(ratios):.2f}"
                  f" (per-prompt ratios {min(ratios):.2f}-{max(ratios):.2f}; after the first token"
                  f" x{statistics.median(decode_ratios):.2f})"
                  f"   acceptance {rate:.0%} of {drafts1 - drafts0:.0f} drafts", flush=True)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
