"""The family registry: the built-in specs, then those of installed packages.

A package adds a family by shipping a torch-free spec (a :class:`FamilySpec` instance)
and, for speccore to run it, a proposer factory the spec names; it registers the spec
under the ``specops.families`` entry-point group::

    [project.entry-points."specops.families"]
    toy = "toy_family.spec:SPEC"

Every part of specops then knows the family: the schema's family names, the CLI's
``--method`` choices, the predictor's catalog, costs and priors, and ``apply``'s
engine flags. A plugin cannot replace a built-in family, and one that does not load
is an error naming its entry point rather than a family silently missing.
"""

from __future__ import annotations

import functools
from importlib import import_module
from importlib.metadata import entry_points

from speccatalog.families.base import FamilyError, FamilySpec, check_name

ENTRY_POINT_GROUP = "specops.families"
# In the catalog's enumeration order.
BUILTIN = ("ngram", "rest", "draft_model", "lookahead", "medusa", "eagle", "mtp", "cascade", "suffix")


@functools.cache
def families() -> dict[str, FamilySpec]:
    """Every family by name: the built-in ones in BUILTIN's order, then plugins by name."""
    found: dict[str, FamilySpec] = {}
    for name in BUILTIN:
        found[name] = import_module(f"speccatalog.families.{name}").SPEC
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = f"entry point '{point.name} = {point.value}' ({ENTRY_POINT_GROUP})"
        try:
            spec = point.load()
        except Exception as exc:
            raise FamilyError(f"{where} does not load: {type(exc).__name__}: {exc}") from exc
        if not isinstance(spec, FamilySpec):
            raise FamilyError(f"{where} is a {type(spec).__name__}, not a FamilySpec")
        name = check_name(spec.name)
        if name != point.name:
            raise FamilyError(f"{where} names a spec of family '{name}'")
        if name in found:
            raise FamilyError(f"{where} would replace the family '{name}' specops already has")
        found[name] = spec
    return found


def family(name: str) -> FamilySpec:
    """The spec of family ``name``; FamilyError listing the known ones otherwise."""
    spec = families().get(name)
    if spec is None:
        raise FamilyError(f"unknown family '{name}'; known: {', '.join(families())}")
    return spec


def names() -> tuple[str, ...]:
    return tuple(families())


def runnable() -> tuple[str, ...]:
    """The families speccore runs (those whose spec names a proposer)."""
    return tuple(name for name, spec in families().items() if spec.proposer is not None)


def engine_options() -> frozenset[str]:
    """Options any family renders for other engines: speccore ignores them (and reports them)."""
    return frozenset().union(*(spec.engine_options for spec in families().values()))


__all__ = ["ENTRY_POINT_GROUP", "FamilyError", "FamilySpec", "engine_options", "families", "family", "names"]
