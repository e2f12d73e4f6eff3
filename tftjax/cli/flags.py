"""Command lines read from the config dataclasses, in one parse.

Every field of a command's config parts becomes a flat flag (``--hidden-size``, not
``--model.hidden``), typed by its annotation: ``Literal`` and ``Enum`` fields list their
choices, booleans take ``--x`` and ``--no-x``, tuples one or more values (commas split
them too), optional fields the word ``none``. A field's help is the docstring under it
(read from the source); ``setting(cli=False)`` keeps a field off the command line.

:meth:`CommandLine.parse` returns what the user gave, and nothing else: the command lays it
over its defaults (a preset, a settings file, a checkpoint's own settings on ``--resume``),
so that a default never hides a flag and a flag never hides where a value came from.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from tftjax.config.execution import LEGACY_KERNEL_FLAGS
from tftjax.config.fields import choices, field_types, is_optional, strip_optional
from tftjax.errors import ConfigError

HEADINGS = {
    "model": "the network",
    "head": "the quantile head",
    "quant": "quantization",
    "execution": "how it runs",
    "data": "the data",
    "train": "training",
    "options": "this command",
}


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one :class:`ConfigError` line (exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        # "argument --x/--alias: must be ..." → "--x must be ...", as the configs say it
        m = re.fullmatch(r"argument (--[\w-]+)(?:/--[\w-]+)*: (.*)", message, re.DOTALL)
        if m:
            flag, what = m.groups()
            kind = re.fullmatch(r"invalid (\w+) value: (.*)", what)
            if kind:
                what = f"must be {_ARTICLE.get(kind[1], 'a ' + kind[1])}, got {kind[2]}"
            message = f"{flag} {what}"
        raise ConfigError(message)


_ARTICLE = {"int": "an integer", "float": "a number", "Path": "a path", "bool": "true or false"}


@dataclasses.dataclass(frozen=True)
class Parsed:
    """What one command line gave."""

    given: dict[str, dict[str, Any]]
    """Part name → the fields the user gave (typed)."""
    legacy_kernels: dict[str, str]
    """The old per-family kernel switches given (``{"vsn_kernel": "pallas"}``)."""

    def part(self, name: str) -> dict[str, Any]:
        return self.given.get(name, {})

    def options(self, cls: type, **defaults: Any) -> Any:
        """The command's own options: ``cls``'s defaults, ``defaults``, then the flags."""
        return cls(**{**defaults, **self.part("options")})

    def model_settings(self, parts=("model", "head", "quant", "execution", "data")) -> dict:
        """The model config's fields given, flat (what ``TFTConfig.override`` takes)."""
        return {k: v for p in parts for k, v in self.part(p).items()}

    def given_flag(self, part: str, name: str) -> bool:
        return name in self.part(part)


class CommandLine:
    """An argparse parser over a command's config parts and its own options."""

    def __init__(
        self,
        prog: str,
        description: str,
        parts: dict[str, type],
        display: dict[str, Any] | None = None,
        legacy_kernel_flags: bool = False,
        epilog: str | None = None,
        exclude: tuple[str, ...] = (),
    ):
        """``parts``: part name → config dataclass (``"options"``: the command's own);
        ``display``: part name → the instance whose values the help shows as defaults;
        ``exclude``: fields (``part.name``) that this command does not offer."""
        self.parts = parts
        self.parser = _Parser(
            prog=prog,
            description=description,
            epilog=epilog,
            usage=f"{prog} [flags]  (--help lists them)",
            argument_default=argparse.SUPPRESS,
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        seen: dict[str, str] = {}
        for part, cls in parts.items():
            group = self.parser.add_argument_group(HEADINGS.get(part, part))
            shown = (display or {}).get(part)
            for f in dataclasses.fields(cls):
                if not f.metadata.get("cli", True) or f"{part}.{f.name}" in exclude:
                    continue
                names = flag_names(f)
                for n in names:
                    if n in seen:
                        raise ValueError(f"{n} is a flag of both {seen[n]} and {part}")
                    seen[n] = part
                _add(
                    group,
                    f,
                    field_types(cls)[f.name],
                    f"{part}.{f.name}",
                    names,
                    field_docs(cls).get(f.name, ""),
                    shown,
                )
        if legacy_kernel_flags:
            for name in LEGACY_KERNEL_FLAGS:
                self.parser.add_argument(
                    f"--{name.replace('_', '-')}",
                    dest=f"legacy.{name}",
                    type=_converter(Literal["xla", "pallas"], False),
                    help=argparse.SUPPRESS,
                )

    def parse(self, argv: list[str] | None) -> Parsed:
        """The flags given in ``argv`` (default: ``sys.argv[1:]``).

        Raises:
          ConfigError: an unknown flag or a value its type refuses (one line).
        """
        ns = vars(self.parser.parse_args(argv))
        given: dict[str, dict[str, Any]] = {}
        legacy = {}
        for dest, value in ns.items():
            part, _, name = dest.partition(".")
            if part == "legacy":
                legacy[name] = value
            else:
                given.setdefault(part, {})[name] = value
        return Parsed(given, legacy)


def flag_names(f: dataclasses.Field) -> list[str]:
    return [
        "--" + (f.metadata.get("flag") or f.name.replace("_", "-")),
        *f.metadata.get("aliases", ()),
    ]


def _add(
    group, f: dataclasses.Field, tp: Any, dest: str, names: list[str], doc: str, shown: Any
) -> None:
    help_ = doc
    if shown is not None:
        help_ += f" (default: {_show(getattr(shown, f.name))})"
    elif f.default is not dataclasses.MISSING:
        help_ += f" (default: {_show(f.default)})"
    base = strip_optional(tp)
    allowed = choices(base)
    kw: dict[str, Any] = {
        "dest": dest,
        "help": argparse.SUPPRESS if f.metadata.get("hidden") else help_.replace("%", "%%"),
    }
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        kw["required"] = True
    if base is bool:
        group.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
        return
    if "bare" in f.metadata:  # the flag alone means this value: --resume, --resume auto
        kw.update(nargs="?", const=f.metadata["bare"])
    if get_origin(base) is tuple:
        inner = get_args(base)[0]
        inner_choices = choices(inner)
        kw.update(
            nargs="+",
            action=_Extend,
            type=_converter(inner, False, split=inner is not Path),
            metavar=_metavar(inner)
            if inner_choices is None
            else "{" + ",".join(map(str, inner_choices)) + "}",
        )
    else:
        kw.update(type=_converter(base, is_optional(tp)), metavar=_metavar(base, is_optional(tp)))
    if allowed is not None and get_origin(base) is not tuple:
        kw["metavar"] = "{" + ",".join(map(str, allowed)) + "}"
    group.add_argument(*names, **kw)


class _Extend(argparse.Action):
    """One or more values, each also split on commas: ``--x a b``, ``--x a,b``."""

    def __call__(self, parser, namespace, values, option_string=None):
        values = values if isinstance(values, (list, tuple)) else [values]
        setattr(
            namespace,
            self.dest,
            tuple(v for vs in values for v in (vs if isinstance(vs, tuple) else (vs,))),
        )


def _converter(tp: Any, optional: bool, split: bool = False):
    allowed = choices(tp)

    def one(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        if allowed is not None:
            if text not in map(str, allowed):
                raise argparse.ArgumentTypeError(
                    f"must be one of {', '.join(map(str, allowed))}, got {text!r}"
                )
            return (
                tp(text)
                if isinstance(tp, type) and issubclass(tp, enum.Enum)
                else next(a for a in allowed if str(a) == text)
            )
        if tp is bool:
            return _bool(text)
        return tp(text)

    one.__name__ = getattr(tp, "__name__", "value")  # argparse's "invalid <name> value"
    if not split:
        return one

    def several(text: str) -> tuple:
        return tuple(one(t) for t in text.split(",") if t != "")

    several.__name__ = one.__name__
    return several


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")


def _metavar(tp: Any, optional: bool = False) -> str:
    name = {int: "INT", float: "FLOAT", str: "STR", Path: "PATH"}.get(tp, "VALUE")
    return f"{name}|none" if optional else name


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(_show(v) for v in value) or "none"
    return "none" if value is None else str(value)


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls`` (its source read with ``ast``), whitespace
    collapsed; base classes' first."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                out[node.target.id] = re.sub(r"\s+", " ", nxt.value.value).strip()
    return out
