"""Quality on a real GGUF file: kernelcore computing with the stored blocks against a float32 reference of the
same file (transformers ``from_pretrained(dir, gguf_file=...)``, which dequantizes every tensor).

    python benchmarks/gguf_quality.py FILE [FILE ...]           # kernelcore vs the reference
    python benchmarks/gguf_quality.py --llamacpp FILE           # + llama.cpp on the same checks

Two checks, on a fixed real English text (benchmarks/data/alice_ch1.txt, Lewis Carroll, public domain):

- perplexity, teacher-forced over its first 600 tokens (the tokenizer's BOS first where it adds one);
- greedy agreement: 8 prompts (the text's first sentences, cut at 8 different points), the first 24 greedy tokens
  each (EOS ignored), counted as equal to the reference's or not.

With ``--llamacpp`` (llama-server and llama-perplexity built from the llama-cpp-python sdist,
benchmarks/llamacpp_build.py) the greedy check runs through llama-server on the same token ids, and perplexity
through llama-perplexity, whose protocol differs (2 chunks of 256 tokens, each evaluated alone with BOS first
where the tokenizer adds one, the second half of each scored): kernelcore and the reference are scored by that
protocol too, so the three figures on that line compare.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import click
import torch

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "alice_ch1.txt")
NUM_TOKENS, NUM_PROMPTS, GREEDY_TOKENS = 600, 8, 24
CHUNK, NUM_CHUNKS = 256, 2  # llama-perplexity's context and chunk count for the chunked protocol


def text_tokens(tokenizer, n: int = NUM_TOKENS) -> list[int]:
    with open(TEXT) as f:
        return list(tokenizer(f.read(), add_special_tokens=True)["input_ids"])[:n]


def chunks(tokens: list[int], bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: CHUNK tokens each, the first replaced by BOS when the tokenizer adds one."""
    out = []
    for k in range(NUM_CHUNKS):
        chunk = tokens[k * CHUNK:(k + 1) * CHUNK]
        out.append(([bos] + chunk[1:]) if bos is not None else chunk)
    return out


def greedy_prompts(tokens: list[int]) -> list[list[int]]:
    return [tokens[:8 + 9 * i] for i in range(NUM_PROMPTS)]


@functools.lru_cache(maxsize=2)
def reference_model(path: str):
    """transformers on the file, float32 (cached: the tests reuse it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32).eval()


def _ref_token_logprobs(model, tokens: list[int]) -> list[float]:
    logp = model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)
    return logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].tolist()


@torch.no_grad()
def reference_results(model, tokens: list[int], prompts: list[list[int]], chunked: list[list[int]]) -> dict:
    token_logp = _ref_token_logprobs(model, tokens)
    greedy = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
                             do_sample=False, pad_token_id=0)
        greedy.append(out[0, len(p):].tolist())
    return {"token_logprobs": token_logp, "greedy": greedy,
            "chunk_logprobs": [_ref_token_logprobs(model, c) for c in chunked]}


def kernelcore_results(path: str, tokens: list[int], prompts: list[list[int]], chunked: list[list[int]],
                       **llm_kwargs) -> dict:
    from kernelcore import LLM, SamplingParams

    llm = LLM(path, max_model_len=1024, **llm_kwargs)
    try:
        scored = llm.generate([{"prompt_token_ids": t} for t in [tokens, *chunked]],
                              SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        token_logp = [[entry[t].logprob for entry, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]
                      for out, ids in zip(scored, [tokens, *chunked], strict=True)]
        params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return {"token_logprobs": token_logp[0], "chunk_logprobs": token_logp[1:],
                "greedy": [list(o.outputs[0].token_ids) for o in outs]}
    finally:
        llm.shutdown()


def perplexity(token_logprobs: list[float], start: int = 0, stop: int | None = None) -> float:
    """exp(-mean log p) over predicted positions [start, stop) (position i predicts token i + 1)."""
    span = token_logprobs[start:stop]
    return math.exp(-sum(span) / len(span))


def chunked_perplexity(chunk_logprobs: list[list[float]]) -> float:
    """llama-perplexity's protocol: in each chunk, the predictions from positions CHUNK/2 .. CHUNK-2."""
    scored = [lp for chunk in chunk_logprobs for lp in chunk[CHUNK // 2:CHUNK - 1]]
    return math.exp(-sum(scored) / len(scored))


def agreement(greedy: list[list[int]], reference: list[list[int]]) -> int:
    return sum(a == b for a, b in zip(greedy, reference, strict=False))


def llamacpp_results(path: str, tokens: list[int], prompts: list[list[int]]) -> dict:
    """Greedy through llama-server (token-id prompts), chunked perplexity through llama-perplexity."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from llamacpp_build import build_server

    server, ppl_tool = build_server(), build_server(tool="llama-perplexity")
    port = 18000 + os.getpid() % 1000
    proc = subprocess.Popen([server, "-m", path, "--port", str(port), "--host", "127.0.0.1", "-c", "2048", "-np", "1",
                             "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health") as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        greedy = []
        for p in prompts:
            body = {"prompt": p, "n_predict": GREEDY_TOKENS, "temperature": 0, "top_k": 1, "ignore_eos": True,
                    "cache_prompt": False, "return_tokens": True, "samplers": ["top_k"]}
            req = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req) as r:
                greedy.append(json.load(r)["tokens"])
    finally:
        proc.terminate()
        proc.wait()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f, open(TEXT) as text:
        f.write(text.read())
    out = subprocess.run([ppl_tool, "-m", path, "-f", f.name, "-c", str(CHUNK), "--chunks", str(NUM_CHUNKS),
                          "-b", str(CHUNK)],
                         capture_output=True, text=True, check=True)
    os.unlink(f.name)
    estimate = [line for line in (out.stdout + out.stderr).splitlines() if "Final estimate: PPL" in line]
    ppl = float(estimate[-1].split("=")[1].split()[0]) if estimate else float("nan")
    return {"greedy": greedy, "chunked_ppl": ppl}


def prefix_tokens(greedy: list[list[int]], reference: list[list[int]]) -> int:
    """Greedy tokens equal to the reference's before each prompt's first difference, summed (a finer figure than
    the prompts that agree throughout)."""
    total = 0
    for ours, ref in zip(greedy, reference, strict=False):
        for a, b in zip(ours, ref, strict=False):
            if a != b:
                break
            total += 1
    return total


def measure_settings(path: str, settings: list[str], llamacpp: bool = False, **llm_kwargs) -> list[dict]:
    """``measure`` for each KC_CPU_GGUF_INT_DOT setting (auto, none, all, a type list), the reference and llama.cpp
    computed once; each result carries its ``int_dot`` setting."""
    from kernelcore import envs
    from kernelcore.models.gguf_checkpoint import tokenizer

    tok = tokenizer(path)
    tokens = text_tokens(tok)
    prompts = greedy_prompts(tokens)
    all_tokens = text_tokens(tok, NUM_CHUNKS * CHUNK)
    chunked = chunks(all_tokens, tok.bos_token_id if all_tokens[0] == tok.bos_token_id else None)
    ref = reference_results(reference_model(path), tokens, prompts, chunked)
    cpp = llamacpp_results(path, tokens, prompts) if llamacpp else None
    results = []
    saved = os.environ.get("KC_CPU_GGUF_INT_DOT")
    try:
        for setting in settings:
            os.environ["KC_CPU_GGUF_INT_DOT"] = setting
            envs.unfreeze()  # an in-process worker froze the environment it started with: read it anew
            ours = kernelcore_results(path, tokens, prompts, chunked, **llm_kwargs)
            results.append(summarize(path, tokens, ref, ours, cpp, int_dot=setting))
    finally:
        if saved is None:
            os.environ.pop("KC_CPU_GGUF_INT_DOT", None)
        else:
            os.environ["KC_CPU_GGUF_INT_DOT"] = saved
    return results


def summarize(path: str, tokens: list[int], ref: dict, ours: dict, cpp: dict | None, **extra) -> dict:
    result = {
        "file": os.path.basename(path), "tokens": len(tokens), **extra,
        "ppl_reference": perplexity(ref["token_logprobs"]), "ppl_kernelcore": perplexity(ours["token_logprobs"]),
        "agree_kernelcore": agreement(ours["greedy"], ref["greedy"]),
        "prefix_kernelcore": prefix_tokens(ours["greedy"], ref["greedy"]),
        "chunked_ppl_reference": chunked_perplexity(ref["chunk_logprobs"]),
        "chunked_ppl_kernelcore": chunked_perplexity(ours["chunk_logprobs"]),
    }
    if cpp is not None:
        result.update(agree_llamacpp=agreement(cpp["greedy"], ref["greedy"]),
                      prefix_llamacpp=prefix_tokens(cpp["greedy"], ref["greedy"]),
                      chunked_ppl_llamacpp=cpp["chunked_ppl"])
    return result


def measure(path: str, llamacpp: bool = False, **llm_kwargs) -> dict:
    """The checks under the environment's KC_CPU_GGUF_INT_DOT (auto where unset)."""
    return measure_settings(path, [os.environ.get("KC_CPU_GGUF_INT_DOT", "auto")], llamacpp, **llm_kwargs)[0]


@click.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--llamacpp", is_flag=True, help="also run llama.cpp on the same checks")
@click.option("--dtype", default="float32", show_default=True)
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="kc's KV cache: auto, float32, bfloat16")
@click.option("--int-dot", "int_dots", multiple=True,
              help="KC_CPU_GGUF_INT_DOT settings to measure kernelcore under (repeatable: auto, none, all, Q8_0, "
              "Q4_1,Q8_0, ...) [default: the environment's, else auto]")
def main(files: tuple[str, ...], llamacpp: bool, dtype: str, kv_cache_dtype: str, int_dots: tuple[str, ...]) -> None:
    settings = list(int_dots) or [os.environ.get("KC_CPU_GGUF_INT_DOT", "auto")]
    for path in files:
        for r in measure_settings(path, settings, llamacpp, dtype=dtype, kv_cache_dtype=kv_cache_dtype):
            print(f"{r['file']}: {r['tokens']} tokens, KC_CPU_GGUF_INT_DOT={r['int_dot']}, KV cache {kv_cache_dtype}")
            print(f"  perplexity      reference {r['ppl_reference']:.4f}  kernelcore {r['ppl_kernelcore']:.4f} "
                  f"({100 * (r['ppl_kernelcore'] / r['ppl_reference'] - 1):+.2f}%)")
            print(f"  greedy {GREEDY_TOKENS} tokens kernelcore {r['agree_kernelcore']}/{NUM_PROMPTS} prompts equal to "
                  "the reference" + (f", llama.cpp {r['agree_llamacpp']}/{NUM_PROMPTS}" if llamacpp else "")
                  + f"; tokens before the first difference kernelcore {r['prefix_kernelcore']}/"
                  f"{NUM_PROMPTS * GREEDY_TOKENS}" + (f", llama.cpp {r['prefix_llamacpp']}" if llamacpp else ""))
            print(f"  chunked ppl     reference {r['chunked_ppl_reference']:.4f}  kernelcore "
                  f"{r['chunked_ppl_kernelcore']:.4f}"
                  + (f"  llama.cpp {r['chunked_ppl_llamacpp']:.4f}" if llamacpp else ""))


if __name__ == "__main__":
    main()
