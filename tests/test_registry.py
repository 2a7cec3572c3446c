import textwrap

import pytest

from distdoctor.core.findings import Finding
from distdoctor.core.registry import RegistryError, SkipCheck


def test_decorator_registers_a_plain_function(fresh_registry):
    kind = fresh_registry.finding_kind("t.E001", cause="unknown", title="t", hint="h")

    @fresh_registry.check(stage="local", tags=("a",), emits=(kind,))
    def probe_thing(ctx):
        """Probes the thing."""
        return [kind()]

    (registered,) = fresh_registry.checks.values()
    assert registered.name.endswith(".probe_thing")
    assert registered.description == "Probes the thing."
    assert registered.emits == (kind,)
    assert probe_thing(None)[0].id == "t.E001"  # the function itself is unchanged


def test_duplicate_finding_ids_are_rejected(fresh_registry):
    fresh_registry.finding_kind("t.E001", cause="unknown", title="one", hint="h")
    with pytest.raises(RegistryError, match="declared twice"):
        fresh_registry.finding_kind("t.E001", cause="firewall", title="other", hint="h")


def test_unknown_stage_is_rejected(fresh_registry):
    with pytest.raises(RegistryError, match="unknown stage"):
        fresh_registry.check(lambda ctx: [], stage="warmup")


def test_select_by_stage_and_tag(fresh_registry):
    fresh_registry.check(lambda ctx: [], stage="collective", tags=("x",), name="c.one")
    fresh_registry.check(lambda ctx: [], stage="local", tags=("y",), name="l.two")
    assert [c.name for c in fresh_registry.select()] == ["l.two", "c.one"]
    assert [c.name for c in fresh_registry.select(tags=["x"])] == ["c.one"]
    assert [c.name for c in fresh_registry.select(stages=["local"])] == ["l.two"]
    assert [c.name for c in fresh_registry.select(skip_tags=["x"])] == ["l.two"]


def test_checks_dir_plugin_that_fails_becomes_a_finding(tmp_path, monkeypatch):
    import distdoctor.core.registry as registry_module

    registry = registry_module.Registry()
    monkeypatch.setattr(registry_module, "REGISTRY", registry)
    monkeypatch.setattr(registry_module, "check", registry.check)
    monkeypatch.setattr(registry_module, "finding_kind", registry.finding_kind)
    (tmp_path / "good.py").write_text(textwrap.dedent("""
        from distdoctor.core.registry import REGISTRY
        K = REGISTRY.finding_kind("good.W001", cause="unknown", title="t", hint="h")
        @REGISTRY.check(stage="local")
        def fine(ctx):
            return []
    """))
    (tmp_path / "broken.py").write_text(textwrap.dedent("""
        from distdoctor.core.registry import REGISTRY
        REGISTRY.finding_kind("broken.W001", cause="unknown", title="t", hint="h")
        import module_that_does_not_exist
    """))
    (tmp_path / "zz_dup.py").write_text(textwrap.dedent("""
        from distdoctor.core.registry import REGISTRY
        REGISTRY.finding_kind("good.W001", cause="firewall", title="clash", hint="h")
    """))
    (tmp_path / "_private.py").write_text("raise SystemExit('never imported')")
    registry.load_checks_dir(tmp_path)
    assert "broken.W001" not in registry.kinds  # rolled back: a plugin is all or nothing
    assert "good.W001" in registry.kinds
    problems = {p.data["source"].rsplit("/", 1)[-1]: p for p in registry.load_problems}
    assert set(problems) == {"broken.py", "zz_dup.py"}
    assert all(isinstance(p, Finding) and p.id == "core.E002" for p in problems.values())
    assert "module_that_does_not_exist" in problems["broken.py"].detail
    assert "declared twice" in problems["zz_dup.py"].detail


def test_missing_checks_dir_is_a_usage_error(fresh_registry, tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        fresh_registry.load_checks_dir(tmp_path / "nope")


def test_entry_point_plugins_are_loaded(monkeypatch, fresh_registry):
    import importlib.metadata as md

    class FakeEP:
        name, value = "fake", "fake_plugin:checks"

        def load(self):
            fresh_registry.finding_kind("ep.W001", cause="unknown", title="t", hint="h")

    class BrokenEP(FakeEP):
        name = "broken"

        def load(self):
            raise ImportError("no such module")

    monkeypatch.setattr(md, "entry_points", lambda group: [FakeEP(), BrokenEP()] if group == "distdoctor.checks" else [])
    fresh_registry.load_entry_points()
    assert "ep.W001" in fresh_registry.kinds
    assert [p.id for p in fresh_registry.load_problems] == ["core.E002"]


def test_skip_check_carries_its_reason():
    assert SkipCheck("no GPUs").reason == "no GPUs"
