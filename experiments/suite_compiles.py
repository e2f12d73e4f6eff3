"""Where the test suite's time goes to XLA: the compile ledger the suite writes when
``TFTJAX_TEST_COMPILES=DIR`` is set (tests/conftest.py), summed.

    TFTJAX_TEST_COMPILES=/tmp/ledger python -m pytest -q -n 2 --dist loadgroup -m "not slow"
    python experiments/suite_compiles.py /tmp/ledger

Prints the tier's test seconds and the part of them spent tracing, lowering and compiling;
the persistent compilation cache's hits, misses and the compile seconds its hits saved; the
tests that compile longest; and the programs compiled most often (the same name compiled
again is a program whose shapes, constants or options differ, or whose executable was
freed: the candidates for sharing). Tracing is summed over nested jits, so it is an upper
bound. CLI subprocesses are not in the ledger."""

import argparse
import json
from collections import Counter
from pathlib import Path


def read(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ledger", type=Path, help="the TFTJAX_TEST_COMPILES folder")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    rows = read(args.ledger)
    if not rows:
        raise SystemExit(
            f"{args.ledger}: no ledger (*.jsonl); run the suite with TFTJAX_TEST_COMPILES"
        )
    total = {k: sum(r.get(k, 0) for r in rows) for k in
             ("wall_s", "trace_s", "lower_s", "compile_s", "saved_s", "hits", "misses")}  # fmt: skip
    print(f"{len(rows)} tests, {total['wall_s']:.0f} s of test time in the workers")
    for k in ("trace_s", "lower_s", "compile_s"):
        print(f"  {k[:-2]:8s} {total[k]:7.0f} s  ({total[k] / total['wall_s']:.0%})")
    print(
        f"persistent cache: {total['hits']} hits, {total['misses']} misses, "
        f"{total['saved_s']:.0f} s of compiling saved by the hits"
    )
    print("\ntests that compile longest (compile s / test s):")
    for r in sorted(rows, key=lambda r: -r.get("compile_s", 0))[: args.top]:
        print(f"  {r.get('compile_s', 0):6.1f} / {r['wall_s']:6.1f}  {r['test']}")
    count, seconds = Counter(), Counter()
    for r in rows:
        for name, (n, s) in r.get("programs", {}).items():
            count[name] += n
            seconds[name] += s
    print("\nprograms by compile seconds (compiles, seconds):")
    for name, s in seconds.most_common(args.top):
        print(f"  {count[name]:5d} {s:7.1f}  {name}")


if __name__ == "__main__":
    main()
