"""The model registry and the kernel table, in-process."""

import logging

import pytest

from kernelcore.kernels import KernelTable
from kernelcore.models.registry import ModelRegistry


class FakeModel:
    supports_tensor_parallel = True

    def compute_logits(self, hidden):
        return hidden


def test_eager_registration_inspects_now_and_lazy_imports_nothing():
    registry = ModelRegistry()
    registry.register_model("Eager", FakeModel)
    registry.register_model("Lazy", "no_such_module_yet:Model")
    assert not registry.is_lazy("Eager") and registry.is_lazy("Lazy")
    assert registry.inspect("Eager").is_text_generation and registry.inspect("Eager").supports_tensor_parallel
    assert not registry.is_imported("Lazy")
    with pytest.raises(ModuleNotFoundError):
        registry.get_model_cls("Lazy")


def test_lazy_entry_is_imported_on_demand_and_info_cached():
    registry = ModelRegistry()
    registry.register_model("Reg", "kernelcore.models.registry:ModelRegistry")
    assert not registry.is_imported("Reg")
    info = registry.inspect("Reg")
    assert registry.is_imported("Reg") and registry.inspect("Reg") is info


@pytest.mark.parametrize("arch,target,exc",
                         [("", FakeModel, TypeError), ("A", "nocolon", ValueError), ("A", 3, TypeError)])
def test_bad_registrations(arch, target, exc):
    with pytest.raises(exc):
        ModelRegistry().register_model(arch, target)


def test_duplicate_architecture_from_another_plugin_warns_naming_both(caplog):
    registry = ModelRegistry()
    registry.owned_by("first_plugin").register_model("Arch", FakeModel)
    with caplog.at_level(logging.WARNING, logger="kernelcore.models"):
        registry.owned_by("second_plugin").register_model("Arch", "x.y:Z")
    assert "first_plugin" in caplog.text and "second_plugin" in caplog.text
    assert registry.owners()["Arch"] == "second_plugin"  # last wins


def test_unknown_architecture_lists_registered_ones_with_owners():
    registry = ModelRegistry()
    registry.register_model("Known", FakeModel)
    with pytest.raises(ValueError, match=r"Known \(plugin <direct call>\)"):
        registry.resolve(["Missing"])


def test_kernel_table_register_override_and_conflicts():
    table = KernelTable()
    table.owned_by("kernels_a").register("rms_norm", lambda x: "triton")
    table.owned_by("kernels_a").register("rms_norm", lambda x: "triton again")  # same plugin again: fine
    with pytest.raises(ValueError, match="kernels_a.*kernels_b"):
        table.owned_by("kernels_b").register("rms_norm", lambda x: "other")
    assert not table.is_overridden("rms_norm")
    table.owned_by("platform").override("rms_norm", lambda x: "torch", owner="cpu")  # an explicit owner wins
    assert table.get("rms_norm")(0) == "torch" and table.winners()["rms_norm"].startswith("cpu:")
    assert table.is_overridden("rms_norm")
    with pytest.raises(KeyError):
        table.override("unknown", lambda: None)
    with pytest.raises(KeyError, match="no kernel named"):
        table.get("unknown")
