"""One registry type for every extension point (operators, variable kinds, templates,
runtimes, policies, ...), with discovery through Python entry points.

A separately installed package extends AutoTailor by naming entry points in the registry's
group (``autotailor.policies``, ``autotailor.kinds``, ...) in its ``pyproject.toml``::

    [project.entry-points."autotailor.policies"]
    cautious = "my_package.policies"          # a module whose import registers it, or
    greedy = "my_package.policies:Greedy"     # an object registered under the entry's name

Entry points are loaded the first time a registry is read (not at import), so importing
AutoTailor stays cheap and a broken plug-in only matters when its registry is used: it is
logged, skipped, and named in the error of a lookup that misses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from importlib import metadata
from types import ModuleType
from typing import Generic, Hashable, TypeVar

from .errors import AutoTailorError, ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind, in registration order (``before=`` inserts ahead of another).

    ``what`` names an entry in messages ("policy", "runtime"); ``group`` is the entry-point
    group plug-ins register through; ``error`` is the exception a failed lookup raises."""

    def __init__(self, what: str, group: str | None = None, error: type[AutoTailorError] = ConfigError,
                 hint: str = ""):
        self.what = what
        self.group = group
        self.error = error
        self.hint = hint  # appended to a failed lookup's message (e.g. how to add one)
        self._entries: dict[Hashable, T] = {}
        self._discovered = group is None
        self._broken: dict[str, str] = {}  # entry point -> why it failed to load

    # -- registering -----------------------------------------------------------------------

    def add(self, name: Hashable, entry: T, *, before: Hashable | None = None, replace: bool = False) -> T:
        """Register ``entry`` as ``name``; a second entry of one name is an error unless ``replace``."""
        if name in self._entries and not replace and self._entries[name] is not entry:
            raise self.error(f"{self.what} {name!r} is registered twice ({self._entries[name]!r} and {entry!r}); "
                             "give the new one another name")
        if before is None:
            self._entries[name] = entry
            return entry
        if before not in self._entries:
            raise self.error(f"{self.what} {name!r}: before={before!r} is not a {self.what}; "
                             f"known: {self._known()}")
        items = [(k, v) for k, v in self._entries.items() if k != name]
        at = [k for k, _ in items].index(before)
        items.insert(at, (name, entry))
        self._entries = dict(items)
        return entry

    def register(self, name: Hashable, *, before: Hashable | None = None) -> Callable[[T], T]:
        """Decorator form of ``add``: ``@POLICIES.register("forecast")``."""

        def deco(entry: T) -> T:
            return self.add(name, entry, before=before)

        return deco

    # -- reading ---------------------------------------------------------------------------

    def get(self, name: Hashable) -> T:
        """The entry ``name``, or this registry's error naming the known ones."""
        self._discover()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            pass
        msg = f"unknown {self.what} {name!r}; known: {self._known()}"
        if self._broken:
            msg += "; plug-ins that failed to load: " + "; ".join(f"{k} ({v})" for k, v in self._broken.items())
        if self.hint:
            msg += f" ({self.hint})"
        raise self.error(msg)

    def find(self, name: Hashable) -> T | None:
        """The entry ``name``, or None."""
        self._discover()
        return self._entries.get(name)

    def names(self) -> list[Hashable]:
        self._discover()
        return list(self._entries)

    def values(self) -> list[T]:
        self._discover()
        return list(self._entries.values())

    def items(self) -> list[tuple[Hashable, T]]:
        self._discover()
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.names())

    def __len__(self) -> int:
        self._discover()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, group={self.group!r}, {len(self._entries)} entries)"

    # -- plug-ins --------------------------------------------------------------------------

    def _known(self) -> str:
        return ", ".join(str(k) for k in self._entries) or "(none)"

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True  # before loading: a plug-in's import may read this registry
        for ep in metadata.entry_points(group=self.group):
            try:
                obj = ep.load()
            except Exception as exc:  # a plug-in's own error must not break the others
                self._broken[f"{ep.name} = {ep.value}"] = f"{type(exc).__name__}: {exc}"
                log.warning("%s plug-in %s = %s failed to load: %s", self.what, ep.name, ep.value, exc)
                continue
            if isinstance(obj, ModuleType) or ep.name in self._entries:
                continue  # the module registered what it holds when imported
            self.add(ep.name, obj)
        if self._broken:
            log.debug("broken %s plug-ins: %s", self.what, self._broken)
