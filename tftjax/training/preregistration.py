"""Pre-registered walk-forward recipes (``python -m tftjax.backtest --preregistered FILE``).

A recipe is committed as a JSON file (``experiments/preregistered/``) before any of its
test windows is scored: the settings of the run (``flags``: preset, anchor, features,
seeds, folds, data, ...), the one test per set (``test``) and the Holm family its verdict
is adjusted in (``holm_family``). The walk-forward refuses a command line that does not
match the recipe, before any fold trains, and records the file's SHA-256 in
``backtest.json``, so that a reader can check that the recipe was fixed first (against the
file's commit time). It cannot undo an earlier reuse of the same test region: what a recipe
never saw is only the data after it was written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from tftjax.errors import ConfigError

REQUIRED = ("set", "written", "flags", "test", "holm_family")
"""What a recipe must say; ``written`` carries its UTC offset (``2026-12-07T16:30+00:00``)."""


def read_recipe(path: str | Path) -> dict:
    """The recipe at ``path``.

    Raises:
      ConfigError: no such file, not JSON, or a required key missing (one line)."""
    p = Path(path)
    try:
        recipe = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--preregistered {p}: no such file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--preregistered {p}: not JSON ({e.msg}, line {e.lineno})") from None
    missing = [k for k in REQUIRED if k not in recipe] if isinstance(recipe, dict) else REQUIRED
    if missing:
        raise ConfigError(f"--preregistered {p}: missing {', '.join(missing)}")
    return recipe


def settings_of(*parts: Any) -> dict[str, Any]:
    """Every field of the given dataclasses (a command's options, a config's parts, the
    training config) by name: the run's effective settings, flags and defaults alike."""
    out: dict[str, Any] = {}
    for part in parts:
        out.update({f.name: getattr(part, f.name) for f in dataclasses.fields(part)})
    return out


def _same(actual: Any, wanted: Any) -> bool:
    if isinstance(actual, (tuple, list)):
        wanted = wanted if isinstance(wanted, (tuple, list)) else [wanted]
        return [str(x) for x in actual] == [str(x) for x in wanted]
    return actual == wanted or str(actual) == str(wanted)


def check(recipe: dict, settings: dict[str, Any], path: str | Path) -> None:
    """Refuse a run whose settings differ from the recipe's ``flags`` (one line naming each
    difference as a flag).

    Raises:
      ConfigError: a setting the run does not have, or a different value."""
    bad = []
    for name, wanted in recipe["flags"].items():
        flag = "--" + name.replace("_", "-")
        if name not in settings:
            bad.append(f"{flag} is not a setting of python -m tftjax.backtest")
        elif not _same(settings[name], wanted):
            bad.append(f"{flag} {_show(settings[name])}, the recipe says {_show(wanted)}")
    if bad:
        raise ConfigError(f"--preregistered {path}: this run is not the recipe: " + "; ".join(bad))


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(x) for x in value) or "(none)"
    return str(value)


def stamp(recipe: dict, path: str | Path) -> dict:
    """What ``backtest.json`` records: the file, its SHA-256, its set, test and family."""
    p = Path(path)
    return {
        "path": str(p),
        "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        "set": recipe["set"],
        "written": recipe["written"],
        "test": recipe["test"],
        "holm_family": recipe["holm_family"],
    }
