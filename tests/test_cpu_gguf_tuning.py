"""GGUF parts in the CPU linears' start-up tuning (builtin_plugins/cpu/gguf_linear.py, linear_tuning.py): each part
offers the float kernel, dequantized tiles + GEMM and, where the quality policy (KC_CPU_GGUF_INT_DOT) allows its
type, the int kernel; the tuner times them at the part's own width and the part then computes with its choice."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch
from torch import nn

gguf = pytest.importorskip("gguf")
import gguf.quants as gq  # noqa: E402

from builtin_plugins.cpu.gguf_linear import CpuGGUFMethod  # noqa: E402
from builtin_plugins.cpu.gguf_native import INT_DEFAULT_TYPES, INT_DOT_TYPES, int_dot_types, load_gguf_kernel  # noqa: E402
from builtin_plugins.cpu.linear_tuning import ROW_COUNTS, row_index, tune_linears  # noqa: E402
from kernelcore.models.gguf_params import GGUFPart  # noqa: E402

pytestmark = pytest.mark.skipif(load_gguf_kernel() is None, reason="no C++ compiler: the GGUF kernels cannot be built")


def make_part(type_name: str, num_out: int, num_in: int, seed: int, setting: str) -> tuple[GGUFPart, torch.Tensor]:
    """A part of random float rows quantized by gguf-py, processed by the CPU method under ``setting``; and its
    exact dequantized weight (float64)."""
    rng = np.random.default_rng(seed)
    kind = gguf.GGMLQuantizationType[type_name]
    blocks = gq.quantize(rng.standard_normal((num_out, num_in)).astype(np.float32) * 0.1, kind)
    part = GGUFPart(0, num_out, num_in, type_name, torch.from_numpy(np.ascontiguousarray(blocks)))
    part.params_dtype = torch.float32
    method = CpuGGUFMethod()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KC_CPU_GGUF_INT_DOT", setting)
        method.process_weights_after_loading(part)
    part.__dict__["quant_method"] = method
    weight = torch.from_numpy(gq.dequantize(blocks, kind).reshape(num_out, num_in)).double()
    return part, weight


@pytest.mark.parametrize("setting, with_int", [("none", False), ("all", True), ("Q4_1,Q8_0", True), ("Q4_0", False)])
def test_the_quality_policy_decides_whether_int_is_offered(setting, with_int):
    part, _ = make_part("Q8_0", 64, 96, 0, setting)
    offered = cast(CpuGGUFMethod, part.quant_method).candidates(part)
    assert set(offered.impls) == ({"float", "dequant", "int"} if with_int else {"float", "dequant"})
    assert offered.in_features == 96 and offered.dtype == torch.float32  # the width, not the blocks' bytes


def test_auto_is_the_measured_policy_and_bad_names_are_refused():
    assert int_dot_types(("auto",)) == INT_DEFAULT_TYPES <= INT_DOT_TYPES
    assert int_dot_types(("all",)) == INT_DOT_TYPES and int_dot_types(()) == frozenset()
    assert int_dot_types(("Q4_1", "Q8_0")) == {"Q4_1", "Q8_0"}
    with pytest.raises(ValueError, match="Q2_K"):
        int_dot_types(("Q2_K",))  # no integer kernel for it


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_every_candidate_computes_the_part(type_name, rows):
    part, weight = make_part(type_name, 48, 128, rows, "all")
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    expected, magnitude = x.double() @ weight.T, x.double().abs() @ weight.abs().T
    with torch.inference_mode():
        for name, impl in cast(CpuGGUFMethod, part.quant_method).candidates(part).impls.items():
            y = impl(part, x, None)
            assert y.shape == (rows, 48) and y.dtype == torch.float32
            # float / dequant: float32 sums of the exact weight; int: activations rounded to 1/254 of their block's
            # largest magnitude (tests/test_cpu_gguf_kernels.py bounds each kernel exactly)
            bound = (2e-5 if name != "int" else 1e-2) * magnitude + 1e-6
            assert ((y.double() - expected).abs() <= bound).all(), name


def test_tuning_installs_a_choice_per_part_shape_and_apply_follows_it():
    model = nn.Sequential()
    for i, (type_name, num_out) in enumerate([("Q4_1", 64), ("Q4_1", 64), ("Q8_0", 32)]):
        model.append(make_part(type_name, num_out, 256, i, "all")[0])
    choices = tune_linears(model, max_rows=40)
    assert len(choices) == 2  # the two Q4_1 parts share a shape and a type
    for key, names in choices.items():
        assert key[0] == "CpuGGUFMethod" and len(names) == len(ROW_COUNTS)
        assert set(names) <= {"float", "dequant", "int"}
    first, second, third = (part.__dict__["_tuned_linear"] for part in model)
    assert first.names == second.names
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(5))
    for part, tuned in ((model[0], first), (model[2], third)):
        with torch.inference_mode():
            chosen = tuned.impls[row_index(5)](part, x, None)
            assert torch.equal(part.quant_method.apply(part, x, None), chosen)


@pytest.mark.parametrize("setting", ["none", "all"])
def test_calls_of_up_to_16_rows_take_one_row_exact_path(setting):
    """Decode batches and speculative verifications: one path (float or int, each computing a row the same whatever
    the call's other rows) for every call of up to 16 rows, so a row alone and the same row among 5 or 16 others
    give the same bits (a verification's tokens equal plain decoding's)."""
    from builtin_plugins.cpu.gguf_linear import SAME_PATH_ROWS

    model = nn.Sequential(*(make_part("Q4_1", 96, 256, i, setting)[0] for i in range(2)))
    tune_linears(model, max_rows=64)
    tuned = model[0].__dict__["_tuned_linear"]
    small = {tuned.names[row_index(rows)] for rows in range(1, SAME_PATH_ROWS + 1)}
    assert len(small) == 1 and small <= {"float", "int"}, tuned.names
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(2))
    part = model[0]
    with torch.inference_mode():
        alone = part.quant_method.apply(part, x[3:4], None)
        for rows in (5, 16):
            assert torch.equal(part.quant_method.apply(part, x[:rows], None)[3:4], alone)
