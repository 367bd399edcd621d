"""ablate/core/registry.py: the one Registry every kind of registered thing uses, by name, refusing a
name taken twice, reachable from a plugin file (importing it without torch: test_repo_rules.py)."""
from __future__ import annotations

import pytest

from ablate.backends import RUN_BACKENDS, backend_class
from ablate.claims.claim_measures import MEASURES, measure
from ablate.claims.claim_plots import PLOTS, plot_kind
from ablate.cli import COMMANDS, main
from ablate.core.errors import ConfigError
from ablate.core.registry import ComponentOption, Registry, RegistryError
from ablate.kernels import KERNEL_BACKENDS, get_backend
from ablate.variants import ACTIVATIONS, INITS, MLPS, NORMS, OPTIMIZERS, PLACEMENTS, PRESETS, SCHEDULES, VariantError


def test_a_name_is_registered_once_by_decorator_or_call_and_looked_up_by_name():
    reg: Registry = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    reg.register("b", 2)
    assert reg.get("a") is a and reg["b"] == 2 and reg.names() == ["a", "b"] and "a" in reg and len(reg) == 2
    assert reg.origin("a") == __name__
    with pytest.raises(RegistryError, match=r"^widget 'a' is registered twice \(first by " + __name__ + r"\)$"):
        reg.register("a", 3)
    assert reg.get("a") is a  # the first one stays
    with pytest.raises(RegistryError, match=r"^unknown widget 'c'; valid: a, b$"):
        reg.get("c")
    assert [] not in reg  # a value read from a file may be unhashable: not registered, no TypeError


def test_a_registry_raises_its_own_kind_of_error():
    assert issubclass(VariantError, RegistryError) and issubclass(RegistryError, ValueError)
    with pytest.raises(VariantError, match="unknown optimizer 'x'"):
        OPTIMIZERS.get("x")
    with pytest.raises(ConfigError, match="unknown kernels 'x'; valid: reference, cpu, triton, cuda, auto"):
        get_backend("x")


def test_every_kind_of_registered_thing_uses_the_one_registry():
    for registry in (PLACEMENTS, NORMS, ACTIVATIONS, MLPS, PRESETS, INITS, OPTIMIZERS, SCHEDULES, KERNEL_BACKENDS,
                     RUN_BACKENDS, COMMANDS, MEASURES, PLOTS):
        assert isinstance(registry, Registry) and len(registry) > 0, registry.axis
    assert {"reference", "cpu", "triton", "cuda"} == set(KERNEL_BACKENDS)
    assert {"local", "ray", "slurm"} == set(RUN_BACKENDS)
    assert backend_class("local").__name__ == "LocalBackend"
    assert type(get_backend("reference")).__name__ == "ReferenceBackend"


@pytest.mark.parametrize("register", [
    lambda: KERNEL_BACKENDS.register("reference", object),
    lambda: RUN_BACKENDS.register("local", lambda: object),
    lambda: COMMANDS.register("train", COMMANDS.get("train")),
    lambda: measure("final_val_loss", "nats", "again")(lambda ctx, cell, params: 0.0),
    lambda: plot_kind("lr_curve")(lambda ctx, metrics, params: None),
    lambda: OPTIMIZERS.register("adamw", object),
], ids=["kernels", "run backend", "command", "measure", "plot kind", "optimizer"])
def test_each_kind_refuses_a_name_taken_twice_in_one_line(register):
    # RegistryError, or the error the CLI shows as bad input for that kind (ConfigError): both ValueErrors
    with pytest.raises((RegistryError, ConfigError), match="is registered twice") as caught:
        register()
    assert "\n" not in str(caught.value)


def test_two_components_sharing_an_option_must_agree_on_its_type():
    reg: Registry = Registry("optimizer")
    reg.register("a", object, options=(ComponentOption("beta1", float, 0.9, "b1"),))
    with pytest.raises(RegistryError, match="declares option beta1 as int, but 'a' as float"):
        reg.register("b", object, options=(ComponentOption("beta1", int, 1, "b1"),))
    assert "b" not in reg


def test_settings_fill_a_components_own_default_where_the_config_leaves_it_unset():
    reg: Registry = Registry("optimizer")
    reg.register("a", object, options=(ComponentOption("momentum", float, 0.9, "m"), ComponentOption("x", int, 3, "x")))

    class Config:
        momentum = None
        x = 5

    assert reg.settings("a", Config()) == {"momentum": 0.9, "x": 5}
    assert reg.declared_options()["x"][0][0] == "a"


PLUGIN_COMMAND = '''
from ablate.cli import COMMANDS, Command

COMMANDS.register("hello", Command("say hello", __name__, takes_plugins=True))


def add_arguments(p):
    p.add_argument("--name", default="world")


def run(args):
    print(f"hello {args.name} ({len(args.imports)} plugin)")
'''


def test_a_plugin_file_registers_a_command_through_the_same_door(tmp_path, capsys):
    plugin = tmp_path / "hello_cmd.py"
    plugin.write_text(PLUGIN_COMMAND)
    assert main(["hello", "--import", str(plugin), "--name", "ablate"]) == 0
    assert capsys.readouterr().out == "hello ablate (1 plugin)\n"


def test_a_duplicate_from_a_plugin_is_one_line_exit_2(tmp_path, capsys):
    plugin = tmp_path / "dup.py"
    plugin.write_text("from ablate.variants import OPTIMIZERS\nOPTIMIZERS.register('adamw', object)\n")
    assert main(["variants", "--import", str(plugin)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optimizer 'adamw' is registered twice" in err
