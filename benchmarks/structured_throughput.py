"""Constrained vs unconstrained decoding throughput, same engine, same run.

    python benchmarks/structured_throughput.py                 # the default model, 32 requests
    python benchmarks/structured_throughput.py --model DIR --requests 64 --repeats 3

W-mixed: half the requests carry a JSON schema (an object with an enum array and bounded fields), half are
unconstrained; the baseline is the same requests all unconstrained, each request generating the same number of
tokens as its constrained twin did (ignore_eos), so both runs produce the same tokens in total. Reported: output
tokens/s of each (median of the repeats), their ratio, and the engine core's bitmask time per step.
"""

from __future__ import annotations

import json
import statistics
import time

import click

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 9999},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]}, "minItems": 12, "maxItems": 12},
    "ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 12}},
    "required": ["id", "tags", "ok", "name"], "additionalProperties": False}


def run(llm, prompts, params) -> tuple[float, int]:
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs), outputs


@click.command()
@click.option("--model", default=None, help="Checkpoint directory [default: the embedded default model].")
@click.option("--requests", "num_requests", default=32, show_default=True)
@click.option("--repeats", default=3, show_default=True)
def main(model: str | None, num_requests: int, repeats: int) -> None:
    from kernelcore.core_types.sampling_params import SamplingParams
    from kernelcore.engine.llm import LLM

    llm = LLM(model, max_model_len=1024)
    prompts = [f"Request {i}: describe the item as JSON." for i in range(num_requests)]
    constrained = [SamplingParams(temperature=0.8, seed=i, max_tokens=400, structured_outputs={"json": SCHEMA})
                   if i % 2 == 0 else SamplingParams(temperature=0.8, seed=i, max_tokens=64, ignore_eos=True)
                   for i in range(num_requests)]
    run(llm, prompts[:4], constrained[:4])  # warm-up: compiles the grammar, builds the matcher caches
    mixed, plain, masks = [], [], []
    for _ in range(repeats):
        manager = llm.engine_core.scheduler.structured
        seconds0, num0 = manager.mask_seconds, manager.num_masks
        elapsed, tokens, outputs = run(llm, prompts, constrained)
        masks.append((manager.mask_seconds - seconds0) / max(1, manager.num_masks - num0))
        for i, out in enumerate(outputs):
            if i % 2 == 0:
                json.loads(out.outputs[0].text)  # every constrained output is valid JSON
        mixed.append(tokens / elapsed)
        baseline = [SamplingParams(temperature=0.8, seed=i, max_tokens=len(o.outputs[0].token_ids), ignore_eos=True)
                    for i, o in enumerate(outputs)]
        elapsed, tokens, _ = run(llm, prompts, baseline)
        plain.append(tokens / elapsed)
    m, p = statistics.median(mixed), statistics.median(plain)
    print(json.dumps({"requests": num_requests, "repeats": repeats, "mixed_tok_s": round(m, 1),
                      "unconstrained_tok_s": round(p, 1), "ratio": round(m / p, 3),
                      "mask_ms_per_step": round(1000 * statistics.median(masks), 3)}))
    llm.shutdown()


if __name__ == "__main__":
    main()
