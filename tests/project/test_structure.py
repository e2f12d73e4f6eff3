"""The package's shape: no import circles inside ``tftjax/`` (every import, also those inside
functions), no command-line module importing another, and files of a readable size.

Read with ``ast`` from the source (nothing is imported), so that a circle fails here and not
as a half-initialised module at some user's first call."""

import ast
from pathlib import Path

from conftest import REPO

ROOT = REPO / "tftjax"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: Path) -> set[str]:
    """The tftjax modules ``path`` imports: ``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b`` (its ``__init__``); relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_every_module_and_their_imports():
    # the graph is read, not empty: spot checks of edges that must be there
    assert len(MODULES) > 40
    assert "tftjax.training.steps" in GRAPH["tftjax.training.trainer"]
    assert "tftjax.data.windows" in GRAPH["tftjax.data"]
    assert "tftjax.quant.core" in GRAPH["tftjax.models.layers"]  # `from tftjax.quant import core`
    assert "tftjax.serving.export" in GRAPH["tftjax.export"]  # an import inside a function


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_package():
    assert cycles(GRAPH) == []


def package(name: str) -> set[str]:
    return {m for m in GRAPH if m == name or m.startswith(name + ".")}


def test_the_layers_import_downwards_only():
    """What the package map says of the packages: training never imports serving (the
    exporter) or a CLI; nothing below the data layer reads data; the models know no
    training; the DQN reaches the TFT through its public faces (the Python API and
    train_and_evaluate), never the trainer's internals."""
    assert package("tftjax.training")
    for m in package("tftjax.training"):
        assert not GRAPH[m] & (package("tftjax.serving") | set(clis())), m
    for m in package("tftjax.stats") | package("tftjax.config"):
        assert not GRAPH[m] & (
            package("tftjax.models") | package("tftjax.training") | package("tftjax.runner")
        ), m
    for m in package("tftjax.stats"):
        assert not any(x.startswith("tftjax.data") for x in GRAPH[m]), m
    for m in package("tftjax.models"):
        assert not GRAPH[m] & (package("tftjax.training") | package("tftjax.runner")), m
    facades = {
        "tftjax.training",
        "tftjax.training.run",
        "tftjax.serving.api",
        "tftjax.serving.saved",
    }
    for m in package("tftjax.dqn"):
        reached = {x for x in GRAPH[m] if x.startswith(("tftjax.training", "tftjax.serving"))}
        assert reached <= facades, (m, reached - facades)
    # the mesh code never imports the memory report: the device's limit lives with devices
    assert not any(m.startswith("tftjax.memory") for m in GRAPH["tftjax.runner.mesh"])


def test_at_most_twelve_modules_lie_at_the_top():
    top = [m for m in MODULES if m.count(".") == 1 and not MODULES[m].name == "__init__.py"]
    assert len(top) <= 12, sorted(top)


def clis() -> list[str]:
    """Modules run as ``python -m`` (they end in ``if __name__ == "__main__"``)."""
    return [m for m, p in MODULES.items() if '__name__ == "__main__"' in p.read_text()]


def test_no_cli_imports_another_cli():
    found = clis()
    assert {"tftjax.train", "tftjax.evaluate", "tftjax.dqn.__main__"} <= set(found)
    for m in found:
        assert not GRAPH[m] & (set(found) - {m}), (m, GRAPH[m] & set(found))


def test_the_top_level_commands_are_thin():
    # a command reads its command line and calls the library (issue 49: at most 120 lines);
    # what it needs beyond that (options, reports, bookkeeping) lives in a package
    for name in ("train", "evaluate", "predict", "backtest", "tune", "export"):
        lines = MODULES[f"tftjax.{name}"].read_text().count("\n")
        assert lines <= 120, (name, lines)


def the_map() -> list[str]:
    """The module map of ``tftjax/__init__.py``'s docstring, in its order."""
    import tftjax

    text = tftjax.__doc__.split("::", 1)[1].split("Entry points", 1)[0]
    return [
        "tftjax" + ("." + line.split()[0] if line.split()[0] != "tftjax" else "")
        for line in text.splitlines()
        if line.startswith("  ") and line.strip()
    ]


def entry_points() -> list[str]:
    """``python -m`` modules (package ``__main__``s and the top-level command modules)."""
    return [m for m in clis() if m not in the_map()]


def test_the_map_names_every_module_in_an_order_the_imports_follow():
    order = the_map()
    assert len(order) == len(set(order))
    named = {m for m, p in MODULES.items() if m != "tftjax" and p.read_text().strip()}
    assert sorted(set(order) | set(entry_points())) == sorted(named), (
        "modules missing from the map: "
        + ", ".join(sorted(named - set(order) - set(entry_points())))
    )
    seen = set()
    for m in order:
        later = GRAPH[m] - seen
        assert not later, f"{m} imports {sorted(later)}, which the map puts after it"
        seen.add(m)
