"""The CPU linears' start-up tuning: every implementation it may choose computes the layer's product, and the
measured choice is installed on every layer of a shape and serves each batch size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from builtin_plugins.cpu.linear import CpuInt8LinearMethod, OneDnnLinearMethod
from builtin_plugins.cpu.linear_tuning import ROW_COUNTS, Candidates, row_index, run_tuned, tune_linears


def _layer(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module:
    layer = nn.Module()
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    return layer


def _method_layer(kind: str, num_out: int, num_in: int, generator: torch.Generator, bias: bool = True):
    dtype = torch.float32 if kind in ("float32", "int8-float32") else torch.bfloat16
    weight = (torch.randn(num_out, num_in, generator=generator) * 0.05).to(dtype)
    layer = _layer(weight, (torch.randn(num_out, generator=generator) * 0.1).to(dtype) if bias else None)
    method = CpuInt8LinearMethod() if kind.startswith("int8") else OneDnnLinearMethod()
    method.process_weights_after_loading(layer)
    layer.quant_method = method
    return layer, method, dtype


def _reference(layer: nn.Module, method, x: torch.Tensor):
    if isinstance(method, CpuInt8LinearMethod):
        weight = method.dequantized_weight(layer, torch.float64)
    else:
        weight = layer.weight.double()
    bias = layer.bias.double() if layer.bias is not None else torch.zeros(weight.shape[0], dtype=torch.float64)
    return x.double() @ weight.T + bias, x.double().abs() @ weight.abs().T + bias.abs()


KINDS = ["float32", "bfloat16", "int8-float32", "int8-bfloat16"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 3, 17, 70])
def test_every_candidate_computes_the_layer(kind, rows):
    g = torch.Generator().manual_seed(rows)
    layer, method, dtype = _method_layer(kind, 40, 64, g)
    candidates = method.candidates(layer)
    assert candidates.dtype == dtype and candidates.impls
    x = torch.randn(rows, 64, generator=g).to(dtype)
    expected, magnitude = _reference(layer, method, x)
    # Float32 accumulation of the same rounded inputs; bfloat16 outputs (and an int8 layer's bfloat16 scale,
    # which the reference dequantizes with) are rounded once more.
    relative = 1e-5 if dtype == torch.float32 else 1.6e-2
    with torch.inference_mode():
        for name, impl in candidates.impls.items():
            try:
                y = impl(layer, x, layer.bias)
            except RuntimeError:  # an implementation this build of torch lacks is never chosen (a test below)
                continue
            if y is None:
                continue
            assert y.dtype == dtype and y.shape == (rows, 40), name
            assert ((y.double() - expected).abs() <= relative * magnitude + 1e-5).all(), name


def test_row_counts_map_to_the_smallest_measured_count_at_or_above():
    assert [ROW_COUNTS[row_index(r)] for r in (1, 2, 3, 4, 5, 8, 9, 512)] == [1, 2, 4, 4, 8, 8, 16, 512]
    assert row_index(4096) == len(ROW_COUNTS) - 1


@pytest.mark.parametrize("kind", KINDS)
def test_tuning_installs_one_choice_per_shape_and_apply_follows_it(kind):
    g = torch.Generator().manual_seed(7)
    model = nn.Sequential()
    for num_out in (48, 48, 32):  # two layers of one shape, one of another
        layer, method, dtype = _method_layer(kind, num_out, 64, g)
        model.append(layer)
    choices = tune_linears(model, max_rows=20)
    assert len(choices) == 2
    tuned = [layer.__dict__["_tuned_linear"] for layer in model]
    assert tuned[0] is not tuned[1] and tuned[0].names == tuned[1].names
    for t, layer in zip(tuned, model, strict=True):
        assert len(t.names) == len(ROW_COUNTS) and set(t.names) <= set(layer.quant_method.candidates(layer).impls)
        assert t.names[row_index(32):] == (t.names[row_index(20)],) * (len(ROW_COUNTS) - row_index(20))
    layer = model[2]
    calls = []
    name = tuned[2].names[row_index(5)]
    real = tuned[2].impls[row_index(5)]
    layer.__dict__["_tuned_linear"] = type(tuned[2])(tuned[2].dtype, tuned[2].names, tuple(
        (lambda lay, x, bias, real=real: calls.append(x.shape[0]) or real(lay, x, bias)) if n == name else i
        for n, i in zip(tuned[2].names, tuned[2].impls, strict=True)))
    x = torch.randn(5, 64, generator=g).to(dtype)
    with torch.inference_mode():
        y = layer.quant_method.apply(layer, x, layer.bias)
    assert 5 in calls
    expected, magnitude = _reference(layer, layer.quant_method, x)
    relative = 1e-5 if dtype == torch.float32 else 1.6e-2
    assert ((y.double() - expected).abs() <= relative * magnitude + 1e-5).all()


class _Method:
    """A vendor-style method offering one implementation that does not apply and one that fails."""

    def __init__(self):
        self.seen: list[str] = []

    def candidates(self, layer):
        def none(layer, x, bias):
            self.seen.append("none")
            return None

        def fails(layer, x, bias):
            raise RuntimeError("not on this CPU")

        def works(layer, x, bias):
            return torch.nn.functional.linear(x, layer.weight, bias)

        return Candidates(("vendor", tuple(layer.weight.shape)), layer.weight.dtype,
                          {"none": none, "fails": fails, "works": works})

    def apply(self, layer, x, bias):
        return run_tuned(layer, x, bias)


def test_implementations_that_refuse_or_fail_are_never_chosen():
    layer = _layer(torch.randn(16, 32))
    layer.quant_method = method = _Method()
    model = nn.Sequential(layer)
    assert tune_linears(model) == {("vendor", (16, 32)): ("works",) * len(ROW_COUNTS)}
    assert method.seen == ["none"]  # tried once, then dropped for every larger count
    x = torch.randn(3, 32)
    torch.testing.assert_close(method.apply(layer, x, None), x @ layer.weight.T)
    assert run_tuned(layer, x.double(), None) is None  # another dtype: the method's own routing


def test_choices_are_kept_on_disk_and_a_restart_measures_nothing(tmp_path):
    calls = []

    class Counting(_Method):
        def candidates(self, layer):
            c = super().candidates(layer)
            return Candidates(c.key, c.dtype,
                              {name: (lambda lay, x, bias, impl=impl: calls.append(1) or impl(lay, x, bias))
                               for name, impl in c.impls.items()})

    def model():
        layer = _layer(torch.randn(16, 32, generator=torch.Generator().manual_seed(0)))
        layer.quant_method = Counting()
        return nn.Sequential(layer)

    first = tune_linears(model(), max_rows=8, cache_dir=tmp_path)
    assert calls and len(list(tmp_path.glob("*.json"))) == 1
    calls.clear()
    again = model()
    assert tune_linears(again, max_rows=8, cache_dir=tmp_path) == first
    assert not calls and again[0].__dict__["_tuned_linear"].names == first[("vendor", (16, 32))]
    assert tune_linears(model(), max_rows=16, cache_dir=tmp_path) == first and calls  # other counts: measured
    for cached in tmp_path.glob("*.json"):  # a file naming implementations these layers lack is measured over
        cached.write_text('{"(\'vendor\', (16, 32))": ["gone", "gone", "gone", "gone", "gone", "gone", "gone", '
                          '"gone", "gone", "gone"]}')
    calls.clear()
    assert tune_linears(model(), max_rows=8, cache_dir=tmp_path) == first and calls


@pytest.mark.parametrize("kind", KINDS)
def test_layers_tuned_in_inference_mode_still_run_outside_it(kind):
    """Tuning runs under inference mode; what it leaves behind (reused buffers, packed weights) must not turn
    a later call outside it into an error."""
    g = torch.Generator().manual_seed(11)
    layer, method, dtype = _method_layer(kind, 40, 64, g)
    tune_linears(nn.Sequential(layer), max_rows=128)
    for rows in (1, 70, 300):
        x = torch.randn(rows, 64, generator=g).to(dtype)
        for impl in method.candidates(layer).impls.values():  # the buffers each path may reuse
            with torch.no_grad():
                y = impl(layer, x, layer.bias)
            assert y is None or y.shape == (rows, 40)
        with torch.no_grad():
            y = method.apply(layer, x, layer.bias)
        expected, magnitude = _reference(layer, method, x)
        relative = 1e-5 if dtype == torch.float32 else 1.6e-2
        assert ((y.double() - expected).abs() <= relative * magnitude + 1e-5).all()
