"""What the config dataclasses share: a field's command-line metadata, and the checks every
config runs on itself (a ``Literal`` field's value is one of its choices).

A config field is a plain dataclass field; :func:`setting` adds what the command line needs
to know of it (its flag's name and old aliases, or that it is no flag at all) and whether it
changes a model's initial parameters. The command-line layer (:mod:`tftjax.cli.flags`)
reads this metadata; nothing here imports it, so the configs import without any CLI
library.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, Literal, get_args, get_origin


def setting(
    default: Any,
    *,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    cli: bool = True,
    hidden: bool = False,
    neutral: bool = False,
) -> Any:
    """A config field with a default and its metadata.

    Args:
      default: the value (immutable: configs are frozen and hashed).
      flag: the flag's name without dashes, where it differs from the field's
        (``hidden`` → ``hidden-size``).
      aliases: further flags that set it (``--hidden``), shown in the help.
      cli: False for fields that are set by the program, never on the command line (the
        input widths, the instrument vocabulary's size).
      hidden: a flag that is accepted but not listed in the help (what one process of a
        command passes to another).
      neutral: the field changes neither the shapes nor the initial values of the
        parameters (models that differ only in such fields share one compiled init).
    """
    return dataclasses.field(
        default=default,
        metadata={
            "flag": flag,
            "aliases": aliases,
            "cli": cli,
            "hidden": hidden,
            "neutral": neutral,
        },
    )


def is_neutral(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("neutral", False))


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of a config dataclass."""
    return typing.get_type_hints(cls)


def choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal``, an ``Enum`` or an optional one; else None."""
    tp = strip_optional(tp)
    if get_origin(tp) is Literal:
        return get_args(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(m.value for m in tp)
    return None


def strip_optional(tp: Any) -> Any:
    """``X | None`` → ``X`` (anything else unchanged)."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def is_optional(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType) and type(None) in get_args(tp)


def flag_name(f: dataclasses.Field) -> str:
    return "--" + (f.metadata.get("flag") or f.name.replace("_", "-"))


def choice_errors(obj: Any) -> dict[str, bool]:
    """``{message: ok}`` for every ``Literal`` or ``Enum`` field of ``obj`` (and every
    element of a tuple of them): what :func:`tftjax.errors.check` reports."""
    out = {}
    for f in dataclasses.fields(obj):
        tp, value = field_types(type(obj))[f.name], getattr(obj, f.name)
        if get_origin(tp) is tuple and get_args(tp)[-1:] == (...,):
            allowed, values = choices(get_args(tp)[0]), tuple(value)
        else:
            allowed, values = choices(tp), (value,)
            if value is None and is_optional(tp):
                continue
        if allowed is None:
            continue
        bad = [v for v in values if getattr(v, "value", v) not in allowed]
        out[
            f"{flag_name(f)} must be one of {', '.join(map(str, allowed))}, got "
            f"{', '.join(repr(getattr(v, 'value', v)) for v in bad)}"
        ] = not bad
    return out


def to_json(obj: Any) -> dict:
    """A config as JSON values: enums by value, tuples as lists, sub-configs nested."""

    def value(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return to_json(v)
        if isinstance(v, enum.Enum):
            return v.value
        if isinstance(v, tuple):
            return [value(x) for x in v]
        return v

    return {f.name: value(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def from_json(cls: type, d: dict, where: str) -> Any:
    """A config of ``cls`` from :func:`to_json`'s dict: lists back to tuples, enum values to
    members, sub-configs rebuilt.

    Raises:
      ConfigError: a field ``cls`` does not have, or a value its checks refuse.
    """
    from tftjax.errors import ConfigError

    names = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(d) - names):
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    types_ = field_types(cls)
    return cls(**{k: coerce(types_[k], v) for k, v in d.items()})


def coerce(tp: Any, v: Any) -> Any:
    if v is None:
        return v
    tp = strip_optional(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(v, dict):
        return from_json(tp, v, tp.__name__)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(v)
        except ValueError:
            return v  # refused by the config's own choice check, naming the flag
    if get_origin(tp) is tuple and isinstance(v, (list, tuple)):
        inner = get_args(tp)[0]
        return tuple(coerce(inner, x) for x in v)
    return v
