"""CustomOp rules: the custom-ops list, dispatch, and out-of-tree replacement by class name."""

import pytest
import torch

from kernelcore.config import KernelConfig, set_current_config, validate_custom_ops
from kernelcore.custom_op import CustomOp, op_registry, op_registry_oot


@CustomOp.register("test_scale")
class ScaleOp(CustomOp):
    def forward_native(self, x):
        return x * 2

    def forward_cpu(self, x):
        return x * 2.0


@pytest.fixture(autouse=True)
def _clean_oot():
    saved = dict(op_registry_oot)
    yield
    op_registry_oot.clear()
    op_registry_oot.update(saved)


def build(custom_ops):
    with set_current_config(KernelConfig(custom_ops=custom_ops)):
        return ScaleOp()


@pytest.mark.parametrize("custom_ops,expected", [
    (["all"], "forward_cpu"), (["none"], "forward_native"), (["none", "+test_scale"], "forward_cpu"),
    (["all", "-test_scale"], "forward_native"), (["all", "+other"], "forward_cpu")])
def test_dispatch_follows_the_custom_ops_list_on_cpu(custom_ops, expected):
    op = build(custom_ops)
    assert op.forward_method_name == expected
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.parametrize("bad", [[], ["all", "none"], ["+x"], ["all", "+x", "-x"], ["all", "x"]])
def test_custom_ops_list_validation(bad):
    with pytest.raises(ValueError):
        validate_custom_ops(bad)


def test_both_plus_and_minus_for_one_op_is_an_error_at_dispatch():
    with pytest.raises(ValueError, match="both enabled and disabled"):
        build(["all", "+test_scale", "-test_scale"])


def test_register_oot_swaps_by_in_tree_class_name_and_keeps_the_op_name():
    @ScaleOp.register_oot
    class VendorScale(ScaleOp):
        def forward_cpu(self, x):
            return x * 3

    op = build(["all"])
    assert type(op) is VendorScale and op.name == "test_scale"
    assert torch.equal(op(torch.ones(1)), torch.full((1,), 3.0))
    assert build(["all", "-test_scale"]).forward_method_name == "forward_native"  # -name still works


def test_second_replacement_from_another_class_is_an_error_naming_both():
    @ScaleOp.register_oot
    class First(ScaleOp):
        pass

    class Second(ScaleOp):
        pass

    with pytest.raises(ValueError, match="First.*Second|Second.*First"):
        ScaleOp.register_oot(Second)


def test_same_replacement_registered_again_is_a_no_op():
    def define():
        class Again(ScaleOp):
            pass
        Again.__qualname__ = "Again"
        return Again

    ScaleOp.register_oot(define())
    ScaleOp.register_oot(define())  # a re-import (spawn, reload) defines an equal class
    assert op_registry_oot["ScaleOp"].__qualname__ == "Again"


def test_replacement_must_subclass_the_in_tree_op():
    class NotASubclass(CustomOp):
        pass

    with pytest.raises(TypeError, match="does not subclass"):
        ScaleOp.register_oot(NotASubclass)


def test_register_oot_rejects_a_positional_string():
    with pytest.raises(TypeError):
        CustomOp.register_oot("ScaleOp")


def test_duplicate_in_tree_op_name_is_an_error():
    assert op_registry["test_scale"] is ScaleOp
    with pytest.raises(ValueError, match="registered twice"):
        CustomOp.register("test_scale")(type("Other", (CustomOp,), {}))
