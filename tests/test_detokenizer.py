import pytest

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.detokenizer import IncrementalDetokenizer
from kernelcore.engine.output_processor import OutputProcessor
from kernelcore.engine.outputs import EngineCoreOutput

PIECES = ["<eos>", "Hel", "lo", " wor", "ld", "!", " or", "gan", "ization", " \xe2", "\x82\xac", "x", "STOP", "ST",
          "OP"]


class ToyTokenizer:
    """Token i decodes to PIECES[i]; pieces 9-10 are the two halves of a UTF-8 euro sign (bytes)."""

    def decode(self, ids, skip_special_tokens=True):
        data = "".join(PIECES[i] for i in ids if not (skip_special_tokens and i == 0))
        return data.encode("latin-1").decode("utf-8", errors="replace")


def _stream(ids, is_finished_last=True, **params):
    sp = SamplingParams(**params)
    d = IncrementalDetokenizer(ToyTokenizer(), [1, 2], sp)
    deltas, stop = [], None
    for i, t in enumerate(ids):
        stop = d.update([t])
        done = stop is not None or i == len(ids) - 1
        deltas.append(d.get_next_output_text(done, is_delta=True))
        if stop:
            break
    return deltas, d.output_text, stop


def test_deltas_concatenate_to_text_and_utf8_is_held():
    deltas, text, _ = _stream([3, 4, 9, 10, 5])
    assert "".join(deltas) == text == " world €!"
    assert "\ufffd" not in "".join(deltas)
    assert deltas[2] == ""  # half a UTF-8 character is not emitted


def test_stop_string_mid_token_cuts_text():
    deltas, text, stop = _stream([3, 6, 7, 8, 5], stop=["gani"])
    assert stop == "gani" and text == " wor or"
    assert "".join(deltas) == text


def test_stop_string_spanning_tokens_never_partially_emitted():
    deltas, text, stop = _stream([3, 4, 13, 14, 5], stop=["STOP"])
    assert stop == "STOP" and text == " world"
    assert all("S" not in d for d in deltas)
    assert "".join(deltas) == text


def test_include_stop_str_in_output():
    deltas, text, stop = _stream([3, 13, 14, 5], stop=["STOP"], include_stop_str_in_output=True)
    assert text == " worSTOP" and "".join(deltas) == text


def test_hold_back_is_flushed_on_finish():
    deltas, text, stop = _stream([3, 4, 13], stop=["STOP"])
    assert stop is None and text == " worldST" and "".join(deltas) == text


def test_output_processor_stop_string_aborts_and_eos_text_dropped():
    proc = OutputProcessor(ToyTokenizer())
    params = SamplingParams(stop=["ld"], output_kind="delta")
    (core_req,) = proc.add_request("r", None, [1, 2], params, eos_token_id=0)
    outs, abort = proc.process_outputs([EngineCoreOutput("r", [3])])
    assert outs[0].outputs[0].text == " wo" and not abort
    outs, abort = proc.process_outputs([EngineCoreOutput("r", [4])])
    assert abort == ["r"] and outs[0].finished
    assert outs[0].outputs[0].finish_reason == "stop" and outs[0].outputs[0].stop_reason == "ld"
    assert outs[0].outputs[0].text == "r" and not proc.has_unfinished_requests()
    proc.add_request("e", None, [1], SamplingParams())
    outs, _ = proc.process_outputs([EngineCoreOutput("e", [1, 0], finish_reason="stop")])
    assert outs[0].outputs[0].text == "Hel" and outs[0].outputs[0].token_ids == [1, 0]


def test_output_processor_n_children():
    proc = OutputProcessor(ToyTokenizer())
    reqs = proc.add_request("p", "x", [1], SamplingParams(n=3, seed=5, output_kind="final_only"))
    assert [r.request_id for r in reqs] == ["0_p", "1_p", "2_p"]
    assert [r.sampling_params.seed for r in reqs] == [5, 6, 7] and {r.parent_id for r in reqs} == {"p"}
    outs, _ = proc.process_outputs([EngineCoreOutput(r.request_id, [3], finish_reason="length") for r in reqs[:2]])
    assert outs == []
    outs, _ = proc.process_outputs([EngineCoreOutput("2_p", [4], finish_reason="length")])
    assert [c.index for c in outs[0].outputs] == [0, 1, 2] and outs[0].finished


@pytest.mark.parametrize("text", ["Hello world, the capital of France is Paris. Ünïcödé ✓ 中文 🙂 end.",
                                  "  spaces   and\nnewlines\n\n  "])
def test_real_tokenizer_deltas_equal_full_decode(text):
    from kernelcore.engine.tokenizer import get_tokenizer
    from kernelcore.models.default_model import ensure_default_model

    tok = get_tokenizer(ensure_default_model())
    prompt = tok("Say:", add_special_tokens=True)["input_ids"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    d = IncrementalDetokenizer(tok, prompt, SamplingParams())
    deltas = []
    for i, t in enumerate(ids):
        d.update([t])
        deltas.append(d.get_next_output_text(i == len(ids) - 1, True))
    full = tok.decode(prompt + ids, skip_special_tokens=True)
    assert "".join(deltas) == d.output_text
    assert full.endswith(d.output_text)


@pytest.mark.parametrize("stop", [None, ["France"]])
def test_final_only_text_equals_the_streamed_text(stop):
    """A final-only request without stop strings is detokenized once, when it finishes: the same text as token
    by token; with stop strings every step is still searched (and the request stopped there)."""
    from kernelcore.engine.tokenizer import get_tokenizer
    from kernelcore.models.default_model import ensure_default_model

    tok = get_tokenizer(ensure_default_model())
    prompt = tok("Say:", add_special_tokens=True)["input_ids"]
    ids = tok("Hello world, the capital of France is Paris. Ünïcödé ✓ 中文 🙂 end.",
              add_special_tokens=False)["input_ids"]
    texts, aborts = {}, {}
    for kind in ("cumulative", "final_only"):
        proc = OutputProcessor(tok)
        proc.add_request("r", None, prompt, SamplingParams(output_kind=kind, stop=stop))
        seen, to_abort = [], []
        for i, t in enumerate(ids):
            outs, abort = proc.process_outputs(
                [EngineCoreOutput("r", [t], finish_reason="length" if i == len(ids) - 1 else None)])
            assert proc.new_tokens == {"r": 1}  # what the front end times tokens by, with or without an output
            seen += outs
            to_abort += abort
            if not proc.has_unfinished_requests():
                break
        assert seen[-1].finished
        if kind == "final_only":
            assert len(seen) == 1
        texts[kind], aborts[kind] = seen[-1].outputs[0].text, to_abort
    assert texts["final_only"] == texts["cumulative"]
    assert aborts["final_only"] == aborts["cumulative"] == ([] if stop is None else ["r"])
    if stop:
        assert texts["final_only"] == "Hello world, the capital of "
