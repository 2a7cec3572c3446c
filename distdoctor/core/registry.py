"""The check registry: checks are plain functions registered with a decorator.

    from distdoctor import check, finding_kind

    IFACE_MISSING = finding_kind("site.E001", cause="wrong_interface",
                                 title="Interface ib0 is missing", hint="Ask the admins")

    @check(stage="local", tags=("network",), emits=(IFACE_MISSING,))
    def ib0_is_up(ctx):
        if "ib0" not in ctx.probes.interfaces():
            yield IFACE_MISSING(detail="...")

Checks come from the built-ins (distdoctor.checks.*), from the entry-point group
``distdoctor.checks`` and from ``--checks-dir`` (plain .py files). A finding ID declared twice
is rejected at load time; a plugin that fails to load becomes a finding, never a crash.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from distdoctor.core.findings import Finding, FindingKind
from distdoctor.core.kinds import CORE_KINDS, PLUGIN_LOAD_FAILED
import contextlib
import io
import importlib.metadata
from distdoctor.core.plugin_vetting import vet_files

from distdoctor.core.stages import STAGES
ENTRY_POINT_GROUP = "distdoctor.checks"
BUILTIN_PACKAGE = "distdoctor.checks"


class RegistryError(Exception):
    """A check or finding kind could not be registered (bad stage, duplicate ID or name)."""


class SkipCheck(Exception):
    """Raised by a check that does not apply here; the reason is shown with the skip."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Check:
    name: str
    func: Callable[..., Any]
    stage: str
    tags: tuple[str, ...] = ()
    emits: tuple[FindingKind, ...] = ()
    # None: the run's per-check timeout applies.
    timeout: float | None = None
    description: str = ""
    source: str = "builtin"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "tags": list(self.tags),
            "emits": [k.id for k in self.emits],
            "description": self.description,
            "source": self.source,
        }


@dataclass
class Registry:
    checks: dict[str, Check] = field(default_factory=dict)
    kinds: dict[str, FindingKind] = field(default_factory=dict)
    # Plugins that failed to load, as findings (core.E002) for the run to report.
    load_problems: list[Finding] = field(default_factory=list)
    # Where registrations made now are attributed ("builtin", "entry point x", "file y.py").
    _source: str = "builtin"
    _loaded_builtins: bool = False
    _loaded_sources: set[str] = field(default_factory=set)

    # -- declaration -------------------------------------------------------------------
    def finding_kind(self, id: str, *, cause: str, title: str, hint: str) -> FindingKind:
        return self.add_kind(FindingKind(id=id, cause=cause, title=title, hint=hint))

    def add_kind(self, kind: FindingKind) -> FindingKind:
        """Register a kind made elsewhere (distdoctor's own, in distdoctor.core.kinds)."""
        id = kind.id
        existing = self.kinds.get(id)
        if existing is not None:
            if existing == kind:
                # Re-importing the same module (tests, reloads) declares the same kind again.
                return existing
            raise RegistryError(f"finding ID {id} is declared twice (again in {self._source})")
        self.kinds[id] = kind
        return kind

    def check(
        self,
        func: Callable[..., Any] | None = None,
        *,
        stage: str = "local",
        tags: Iterable[str] = (),
        emits: Iterable[FindingKind] = (),
        timeout: float | None = None,
        name: str | None = None,
    ) -> Any:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if stage not in STAGES:
                raise RegistryError(f"check {fn.__name__}: unknown stage {stage!r} (one of {STAGES})")
            module = getattr(fn, "__module__", "") or ""
            area = module.rsplit(".", 1)[-1] if module else "check"
            check_name = name or f"{area}.{fn.__name__}"
            doc = (fn.__doc__ or "").strip().splitlines()
            new = Check(
                name=check_name,
                func=fn,
                stage=stage,
                tags=tuple(tags),
                emits=tuple(emits),
                timeout=timeout,
                description=doc[0] if doc else "",
                source=self._source,
            )
            old = self.checks.get(check_name)
            if old is not None and _origin(old.func) != _origin(fn):
                # A site file named like a built-in module (network.py defining rendezvous_port)
                # must not silently replace the built-in check: the clash is reported instead.
                raise RegistryError(
                    f"check name {check_name} is already registered by {old.source}; "
                    f"rename the function or the file ({self._source} would replace it)"
                )
            self.checks[check_name] = new
            return fn

        return register(func) if func is not None else register

    # -- queries -----------------------------------------------------------------------
    def select(
        self,
        stages: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
        skip_tags: Iterable[str] = (),
    ) -> list[Check]:
        """Checks of these stages with one of ``tags`` (all when none) and none of ``skip_tags``."""
        stage_set = set(stages) if stages else set(STAGES)
        tag_set, skip_set = set(tags or ()), set(skip_tags)
        chosen = [
            c
            for c in self.checks.values()
            if c.stage in stage_set
            and (not tag_set or tag_set.intersection(c.tags))
            and not skip_set.intersection(c.tags)
        ]
        return sorted(chosen, key=lambda c: STAGES.index(c.stage))

    # -- loading -----------------------------------------------------------------------
    def load_builtins(self) -> None:
        if self._loaded_builtins:
            return
        # Loaded by name, as the plugins are: the engine (core) never imports the checks layer.
        builtin_pkg = importlib.import_module(BUILTIN_PACKAGE)
        for info in sorted(pkgutil.iter_modules(builtin_pkg.__path__), key=lambda m: m.name):
            if info.name.startswith("_"):
                continue
            self._load(f"builtin {info.name}", lambda n=info.name: importlib.import_module(f"{BUILTIN_PACKAGE}.{n}"))
        self._loaded_builtins = True

    def load_entry_points(self) -> None:

        try:
            eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        except Exception as exc:  # a broken installed distribution must not stop the run
            self._problem(f"entry points of group {ENTRY_POINT_GROUP}", exc)
            return
        for ep in eps:
            self._load(f"entry point {ep.name} ({ep.value})", ep.load)

    def load_checks_dir(self, directory: str | Path, *, vet_timeout: float | None = None) -> None:
        """Load the site checks of a directory.

        With ``vet_timeout``, each file is first imported in a child process under that deadline
        (distdoctor.core.plugin_vetting): a file that blocks at import, holds the interpreter
        lock or ends its process is reported (core.E002) and never imported here.
        """
        files = _site_files(directory)
        verdicts = {}
        if vet_timeout is not None and files:

            verdicts = vet_files(files, vet_timeout)
        for file in files:
            source = f"file {file}"
            problem = verdicts.get(file)
            if problem is not None and source not in self._loaded_sources:
                self._loaded_sources.add(source)
                self._problem(source, PluginVetoed(problem))
                continue
            self._load(source, lambda f=file: _import_quietly(f))

    def _load(self, source: str, loader: Callable[[], Any]) -> None:
        if source in self._loaded_sources:
            return
        before_checks, before_kinds = dict(self.checks), dict(self.kinds)
        previous, self._source = self._source, source
        try:
            loader()
            self._loaded_sources.add(source)
        except (Exception, SystemExit) as exc:
            # Roll back whatever the half-imported plugin registered: a plugin is all or nothing.
            self.checks, self.kinds = before_checks, before_kinds
            self._problem(source, exc)
        finally:
            self._source = previous

    def _problem(self, source: str, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.load_problems.append(
            PLUGIN_LOAD_FAILED(
                f"Checks from {source} could not be loaded",
                detail=tb,
                data={"source": source, "error": tb},
                check="registry",
            )
        )


class PluginVetoed(Exception):
    """A site file that failed its import in the vetting child (hung, ended its process)."""


def _origin(func: Callable[..., Any]) -> tuple[str, str]:
    return (getattr(func, "__module__", "") or "", getattr(func, "__qualname__", "") or "")


def _site_files(directory: str | Path) -> list[Path]:
    """The .py files of a --checks-dir (not starting with _), or RegistryError for a bad path."""
    path = Path(directory)
    shown = str(path) if len(str(path)) <= 80 else f"{str(path)[:60]}… ({len(str(path))} characters)"
    try:
        if not path.is_dir():
            raise RegistryError(f"checks directory {shown!r} does not exist or is not a directory")
        return [f for f in sorted(path.glob("*.py")) if not f.name.startswith("_")]
    except OSError as exc:  # a name too long, a directory we may not read
        raise RegistryError(f"checks directory {shown!r} cannot be read: {exc.strerror or exc}") from None


def _import_quietly(file: Path) -> Any:
    """Import a site file with its prints kept off stdout/stderr (they would corrupt a JSON report)."""

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return _import_file(file)


def _import_file(file: Path) -> Any:
    module_name = f"distdoctor_site_checks.{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


# The process-wide registry that the decorators below fill.
REGISTRY = Registry()
for _kind in CORE_KINDS:
    REGISTRY.add_kind(_kind)
check = REGISTRY.check
finding_kind = REGISTRY.finding_kind
