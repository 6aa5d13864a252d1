"""The plugin-set digest tells environments apart by their plugin distributions alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pi_workflows.plugin_set import plugin_entry_points, plugin_set_digest
from pi_workflows.plugins import load_plugins
from pi_workflows.testing.isolation import isolating_env


def install(site: Path, name: str, version: str, entry_points: str) -> None:
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"  # as installers name it
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_the_digest_follows_installed_upgraded_and_disabled_plugins(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delenv("PI_WORKFLOWS_DISABLE_PLUGINS", raising=False)
    before = plugin_set_digest()
    # Another group's entry points are not plugins.
    install(tmp_path, "piw-tool", "1.0", "[console_scripts]\npiw-tool = piw_tool:main\n")
    assert plugin_set_digest() == before

    install(tmp_path, "piw-extra", "1.0", "# comment\n[pi_workflows]\nextra = piw_extra.hooks\n")
    assert ("extra", "piw_extra.hooks", "piw-extra", "1.0") in set(plugin_entry_points())
    installed = plugin_set_digest()
    assert installed != before

    (tmp_path / "piw_extra-1.0.dist-info").rename(tmp_path / "piw_extra-2.0.dist-info")
    metadata = tmp_path / "piw_extra-2.0.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 1.0", "Version: 2.0"))
    upgraded = plugin_set_digest()
    assert upgraded not in (before, installed)

    monkeypatch.setenv("PI_WORKFLOWS_DISABLE_PLUGINS", "extra")
    assert plugin_set_digest() not in (installed, upgraded)


@pytest.mark.parametrize("later", ["piw_extra-9.0.dist-info", "PIW.Extra-9.0.egg-info"])
def test_of_two_distributions_with_one_name_the_first_on_the_path_counts(
    tmp_path, monkeypatch, later
):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setattr(sys, "path", [str(first), str(second), *sys.path])
    install(first, "piw-extra", "1.0", "[pi_workflows]\nextra = piw_extra.hooks\n")
    shadowed = second / later
    shadowed.mkdir()
    (shadowed / "entry_points.txt").write_text("[pi_workflows]\nshadowed = piw_extra.old\n")
    names = {entry_point.name for entry_point in plugin_entry_points()}
    assert "extra" in names and "shadowed" not in names


def test_an_entry_point_naming_an_attribute_loads_that_object_with_its_distribution(
    tmp_path, monkeypatch
):
    # The loader reads the same metadata as the digest (no importlib.metadata): the value
    # `module:attr.attr [extra]` names an object inside the module, extras left out.
    (tmp_path / "piw_holder.py").write_text(
        "from pi_workflows.plugin import hookimpl\n"
        "class Holder:\n"
        "    class Plugin:\n"
        "        @staticmethod\n"
        "        @hookimpl\n"
        "        def piw_presentation_instructions(run, facts):\n"
        "            return 'Held.'\n"
    )
    install(tmp_path, "piw-holder", "3.1", "[pi_workflows]\nheld = piw_holder:Holder.Plugin [x]\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    for variable, value in isolating_env(entry_points=["held"]).items():
        monkeypatch.setenv(variable, value)

    registry = load_plugins()

    assert registry.load_errors == []
    plugin = registry.manager.get_plugin("held")
    assert plugin.__qualname__ == "Holder.Plugin"
    assert (registry.sources["held"].distribution, registry.sources["held"].version) == (
        "piw-holder",
        "3.1",
    )
