"""The one registry helper: register, get, list, duplicates refused, metadata, discovery."""

from __future__ import annotations

import sys

import pytest

from captioning.errors import ConfigError
from captioning.registry import Registry


def test_register_get_and_metadata():
    reg: Registry = Registry("metric", config_key="metrics")

    @reg.register("bleu", keys=("Bleu_1", "Bleu_4"), default=True)
    def bleu():
        return "b"

    @reg.register("spice", default=False)
    def spice():
        return "s"

    assert reg.get("bleu") is bleu and reg.get("bleu")() == "b"
    assert reg.entry("bleu").meta == {"keys": ("Bleu_1", "Bleu_4"), "default": True}
    assert reg.names() == ["bleu", "spice"] and reg.names(default=True) == ["bleu"]
    assert "spice" in reg and "cider" not in reg and len(reg) == 2
    assert [e.name for e in reg] == ["bleu", "spice"]


def test_unknown_name_is_one_line_naming_the_key_and_the_choices():
    reg: Registry = Registry("decoder", config_key="model.name")
    reg.add("lstm", object())
    with pytest.raises(ConfigError, match=r"^model.name='gru' is not a registered decoder; use one of lstm$"):
        reg.get("gru")


def test_a_name_registered_twice_is_refused_unless_it_is_the_same_object():
    reg: Registry = Registry("backbone")
    obj = object()
    reg.add("a", obj)
    reg.add("a", obj)  # re-import of the same module: fine
    with pytest.raises(ValueError, match="backbone 'a' is registered twice"):
        reg.add("a", object())


def test_discovery_imports_every_module_of_the_package_once(tmp_path, monkeypatch):
    pkg = tmp_path / "plugins_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from captioning.registry import Registry\nREG = Registry('format', discover=__name__)\n")
    (pkg / "alpha.py").write_text("from plugins_for_test import REG\nREG.add('alpha', 1)\n")
    (pkg / "beta.py").write_text("from plugins_for_test import REG\nREG.add('beta', 2)\n")
    (pkg / "_private.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        from plugins_for_test import REG

        assert sorted(REG.names()) == ["alpha", "beta"] and REG.get("beta") == 2
    finally:
        for name in [m for m in sys.modules if m.startswith("plugins_for_test")]:
            del sys.modules[name]
