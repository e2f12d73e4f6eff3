"""Every ``python -m tftjax.X …`` command the README and docs/ show still parses: each runs
in-process with ``--help`` appended (its flags and values are parsed up to the help, so a
renamed or removed flag, or a value of the wrong type, fails here), exit code 0."""

import importlib
import re
import shlex

import pytest
from conftest import REPO

ROOT = REPO
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks that are shell (```bash, ```sh or unlabelled)."""
    out, block, lang = [], None, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block, lang = [], line.strip()[3:].strip()
            else:
                if lang in ("", "bash", "sh", "console", "shell"):
                    out.append("\n".join(block))
                block = None
        elif block is not None:
            block.append(line)
    return out


def commands() -> list[tuple[str, str]]:
    """``(where, command)`` of every ``python -m tftjax…`` command line in the sources' code
    blocks (a trailing ``# comment`` and shell continuations dropped)."""
    out = {}
    for path in SOURCES:
        text = "\n".join(shell_blocks(path.read_text())).replace("\\\n", " ")
        for m in re.finditer(r"python -m (tftjax[\w.]*)([^\n]*)", text):
            line = (m.group(1) + m.group(2)).split(" #")[0].strip()
            if "…" in line or "..." in line or "<" in line:  # a pattern, not a command
                continue
            out.setdefault(line, f"{path.name}")
    return sorted((w, c) for c, w in out.items())


def test_the_docs_show_commands():
    found = {c.split()[0] for _, c in commands()}
    assert {
        "tftjax.train",
        "tftjax.dqn",
        "tftjax.predict",
        "tftjax.backtest",
        "tftjax.memory",
    } <= found


@pytest.mark.parametrize("where,command", commands())
def test_a_documented_command_parses(where, command, capsys):
    words = shlex.split(command)
    module = words[0]
    if (ROOT / module.replace(".", "/") / "__main__.py").is_file():  # a package's entry
        module += ".__main__"
    mod = importlib.import_module(module)
    main = mod.main
    try:
        rc = main(words[1:] + ["--help"])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    assert rc in (0, None), f"{where}: {command}\n{out.err[-800:]}"
