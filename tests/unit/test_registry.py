"""Registry semantics: a name is registered once, replaced only on request, resolved by alias."""

from __future__ import annotations

import itertools

import pytest

from ndplan.core.errors import ExitCode, InvalidInputError, PluginError
from ndplan.plugins.registry import Registry, RuleList, normalise


def _add(reg: Registry, plugin: str, name: str, value: object, **kwargs: object) -> None:
    """Register as ``plugin`` would from inside its hook."""
    reg.current_plugin = plugin
    reg.add(name, value, **kwargs)


def test_a_duplicate_name_is_refused_naming_both_plugins() -> None:
    reg: Registry[str] = Registry("cost model")
    _add(reg, "ndplan.builtin", "ndplan", "builtin-model")

    with pytest.raises(PluginError) as err:
        _add(reg, "acme_costs", "ndplan", "acme-model")

    message = str(err.value)
    assert "cost model 'ndplan'" in message
    assert "'ndplan.builtin'" in message and "'acme_costs'" in message
    assert "pass replace=True in 'acme_costs' to replace the built-in one" in message
    assert err.value.exit_code is ExitCode.PLUGIN_ERROR
    assert reg.get("ndplan") == "builtin-model"  # the refused one changed nothing


def test_the_fix_names_the_third_party_plugin_whichever_registered_first() -> None:
    """Built-in hooks run last: the duplicate surfaces as ndplan.builtin adds its own."""
    reg: Registry[str] = Registry("device")
    _add(reg, "acme_devices", "h100-sxm", "acme")
    with pytest.raises(PluginError) as err:
        _add(reg, "ndplan.builtin", "h100-sxm", "builtin")
    assert "pass replace=True in 'acme_devices' to replace the built-in one" in str(err.value)


@pytest.mark.parametrize("replacer_first", [True, False], ids=["replacer-first", "replacer-last"])
def test_replace_wins_whatever_the_hook_order_and_records_whom_it_replaced(
    replacer_first: bool,
) -> None:
    reg: Registry[str] = Registry("device")
    builtin = ("ndplan.builtin", "h100-sxm", "datasheet", {"aliases": ("H100", "HGX H100")})
    replacer = ("acme_devices", "h100-sxm", "derated", {"replace": True})
    for plugin, name, value, kwargs in (
        (replacer, builtin) if replacer_first else (builtin, replacer)
    ):
        _add(reg, plugin, name, value, **kwargs)

    entry = reg.entry("h100-sxm")
    assert entry.value == "derated"
    assert entry.plugin == "acme_devices"
    assert entry.replace is True
    assert entry.replaced == "ndplan.builtin"
    assert len(reg) == 1
    # The replaced device's aliases still lead to the name, in either order.
    assert reg.get("hgx-h100") == "derated"
    assert reg.resolve("H100") == "h100-sxm"


def test_the_listing_shows_the_replacement() -> None:
    reg: Registry[int] = Registry("executor")
    _add(reg, "ndplan.builtin", "serial", 1)
    _add(reg, "ndplan.builtin", "pool", 2)
    _add(reg, "fast_pool", "pool", 3, replace=True)

    listing = [(e.name, e.plugin, e.replaced) for e in reg.entries()]
    assert listing == [("pool", "fast_pool", "ndplan.builtin"), ("serial", "ndplan.builtin", None)]
    assert list(reg) == ["pool", "serial"]


def test_two_replacements_of_one_name_are_refused() -> None:
    reg: Registry[str] = Registry("cost model")
    _add(reg, "ndplan.builtin", "ndplan", "a")
    _add(reg, "first", "ndplan", "b", replace=True)

    with pytest.raises(PluginError, match=r"replaced by both 'first' and 'second'"):
        _add(reg, "second", "ndplan", "c", replace=True)


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_a_duplicate_original_is_refused_even_after_a_replacement(order: tuple[int, ...]) -> None:
    """Two plugins registering one name without replace=True is an error in every order."""
    calls = [
        ("ndplan.builtin", {"replace": False}),
        ("other_plugin", {"replace": False}),
        ("replacer", {"replace": True}),
    ]
    reg: Registry[str] = Registry("debug sink")

    with pytest.raises(PluginError) as err:
        for i in order:
            plugin, kwargs = calls[i]
            _add(reg, plugin, "csv", plugin, **kwargs)

    message = str(err.value)
    assert "'ndplan.builtin'" in message and "'other_plugin'" in message


def test_an_unknown_name_lists_the_known_ones_and_suggests_close_matches() -> None:
    reg: Registry[str] = Registry("device")
    for name in ("h100-sxm", "h200", "mi300x", "gb200"):
        _add(reg, "ndplan.builtin", name, name)

    with pytest.raises(InvalidInputError) as err:
        reg.get("h100-sxn")

    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("unknown device 'h100-sxn'")
    assert "did you mean h100-sxm" in message
    assert "(known: gb200, h100-sxm, h200, mi300x)" in message
    assert err.value.exit_code is ExitCode.INVALID_INPUT


def test_an_unknown_name_far_from_everything_suggests_nothing() -> None:
    reg: Registry[str] = Registry("export format")
    _add(reg, "ndplan.builtin", "megatron", "m")

    with pytest.raises(InvalidInputError) as err:
        reg.resolve("zzzz")

    assert "did you mean" not in str(err.value)
    assert "(known: megatron)" in str(err.value)


@pytest.mark.parametrize(
    "spelling",
    ["h100-sxm", "H100-SXM", "h100_sxm", "H100 SXM", "h100sxm", "H100", "nvidia h100 80gb hbm3"],
)
def test_names_and_aliases_resolve_ignoring_case_and_punctuation(spelling: str) -> None:
    reg: Registry[str] = Registry("device")
    _add(reg, "ndplan.builtin", "h100-sxm", "H", aliases=("H100", "NVIDIA H100 80GB HBM3"))
    _add(reg, "ndplan.builtin", "h200", "H2")

    assert reg.resolve(spelling) == "h100-sxm"
    assert reg.get(spelling) == "H"
    assert spelling in reg


def test_normalise_keeps_only_letters_and_digits() -> None:
    assert normalise("H100-SXM5 (80 GB)") == "h100sxm580gb"


def test_membership_does_not_raise_for_unknown_names() -> None:
    reg: Registry[str] = Registry("device")
    assert "anything" not in reg
    assert reg.entries() == []


def test_refusal_rules_keep_their_order_and_refuse_a_repeated_name() -> None:
    rules = RuleList()
    rules.current_plugin = "a"
    rules.add("too-many-stages", lambda layout, ctx: None)
    rules.add("odd-tp", lambda layout, ctx: None)
    assert [n for n, _ in rules.rules] == ["too-many-stages", "odd-tp"]

    rules.current_plugin = "b"
    with pytest.raises(PluginError, match=r"'odd-tp' is registered twice \(by 'b'\)"):
        rules.add("odd-tp", lambda layout, ctx: None)


@pytest.mark.parametrize("plugin_first", [True, False])
def test_an_alias_another_plugins_entry_answers_to_is_refused(plugin_first: bool) -> None:
    """`-d H100` must not mean a plugin's lab device because its hook ran first."""
    reg: Registry[str] = Registry("device")
    calls = [("acme_devices", "lab", ("H100",)), ("ndplan.builtin", "h100-sxm", ("h100",))]
    if not plugin_first:
        calls.reverse()
    with pytest.raises(PluginError) as err:
        for plugin, name, aliases in calls:
            reg.current_plugin = plugin
            reg.add(name, name, aliases=aliases)
    message = str(err.value)
    assert "is claimed by" in message and message.endswith("drop it from 'acme_devices'")


def test_one_plugins_entries_may_share_an_alias() -> None:
    """Within one plugin the first entry keeps it (the built-in catalog's own order)."""
    reg: Registry[str] = Registry("device")
    reg.current_plugin = "ndplan.builtin"
    reg.add("a100-80gb", "a", aliases=("a100",))
    reg.add("a100-40gb", "b", aliases=("a100",))
    assert reg.resolve("A100") == "a100-80gb"


# --------------------------------------------------------------- audit: replace and keys


@pytest.mark.parametrize("replacement_first", [True, False])
def test_a_replacement_is_pending_until_the_name_it_replaces_is_registered(
    replacement_first: bool,
) -> None:
    """Built-in hooks run last: a replacement only 'replaced nothing' once all registered."""
    reg: Registry[str] = Registry("device")
    calls = [("acme", "h100-sxm", True), ("ndplan.builtin", "h100-sxm", False)]
    if not replacement_first:
        calls.reverse()
    for plugin, name, replace in calls:
        _add(reg, plugin, name, plugin, replace=replace)
    assert reg.unreplaced() == []
    assert reg.entry("h100-sxm").replaced == "ndplan.builtin"


def test_a_replacement_of_a_name_nobody_registers_is_reported_with_close_names() -> None:
    reg: Registry[str] = Registry("device")
    _add(reg, "acme", "h100-sxn", "acme", replace=True)  # the typo ran first ...
    _add(reg, "ndplan.builtin", "h100-sxm", "builtin")  # ... and the built-in stays

    (entry,) = reg.unreplaced()
    assert entry.name == "h100-sxn"
    assert reg.unreplaced_text(entry) == (
        "device 'h100-sxn' from 'acme' is registered with replace=True, but no other plugin "
        "registers 'h100-sxn': fix the name to replace one (did you mean h100-sxm?), or drop "
        "replace=True to add it as a new one"
    )
    assert "(unless disabled labdevices does)" in reg.unreplaced_text(entry, ("labdevices",))


def test_a_third_party_may_replace_another_third_partys_name() -> None:
    for order in itertools.permutations([("a_devices", False), ("b_devices", True)]):
        reg: Registry[str] = Registry("device")
        for plugin, replace in order:
            _add(reg, plugin, "lab-x", plugin, replace=replace)
        assert reg.get("lab-x") == "b_devices"
        assert reg.unreplaced() == []


class _Spec:
    def __init__(self, id: str) -> None:
        self.id = id


def test_a_keyed_registry_refuses_a_name_other_than_the_values_own() -> None:
    """`ndplan devices` lists a device by its id: under another key `-d <id>` finds nothing."""
    reg: Registry[_Spec] = Registry("device", key="id")
    with pytest.raises(PluginError) as err:
        _add(reg, "acme", "x6000-renamed", _Spec("x6000"))
    assert str(err.value) == (
        "device 'x6000-renamed' from 'acme' has id 'x6000', so it would be listed as 'x6000' "
        "but found only as 'x6000-renamed'; register it as its id: registry.add(spec.id, spec)"
    )
    assert "x6000-renamed" not in reg

    _add(reg, "acme", "x6000", _Spec("x6000"))
    assert reg.get("X6000").id == "x6000"
