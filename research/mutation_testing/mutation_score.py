"""Per-module mutation score from mutmut's results in mutants/ (after `make mutate`).

"undetected" is over the mutants checked so far; "not run" counts those mutmut has not reached yet.

    python research/mutation_testing/mutation_score.py            # table: killed / survived / no tests / timeout / total
    python research/mutation_testing/mutation_score.py --list     # also every surviving or untested mutant, by name

Survived and untested mutants both count against the score: a mutant no selected test
reaches is as undetected as one that a test runs and misses. Timeouts count as killed
(the mutant made the code hang, which a test run notices).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          37: "killed", -11: "crashed", -9: "crashed", None: "not checked"}


def module_results(root: Path) -> dict[str, dict[str, str]]:
    """{module path: {mutant name: status}} from mutmut's .meta files (unchecked mutants included)."""
    out = {}
    for meta in sorted(root.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        module = str(meta.relative_to(root))[: -len(".meta")]
        out[module] = {name: STATUS.get(code, "suspicious") for name, code in data["exit_code_by_key"].items()}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mutants", type=Path, default=Path("mutants"))
    p.add_argument("--list", action="store_true", help="list surviving and untested mutants")
    args = p.parse_args(argv)
    results = module_results(args.mutants)
    if not results:
        print(f"no mutmut results under {args.mutants}/: run `make mutate` first", file=sys.stderr)
        return 1
    total = Counter()
    print(f"{'module':32} {'killed':>7} {'survived':>9} {'no tests':>9} {'timeout':>8} {'other':>6} {'checked':>8} "
          f"{'not run':>8} {'undetected':>11}")

    def row(name, c):
        known = ("killed", "survived", "no tests", "timeout", "not checked")
        other = sum(v for k, v in c.items() if k not in known)
        n = sum(c.values()) - c["not checked"]  # the score is over the mutants checked so far
        undetected = c["survived"] + c["no tests"]
        score = f"{100 * undetected / n:10.1f}%" if n else f"{'not run':>11}"
        print(f"{name:32} {c['killed']:7} {c['survived']:9} {c['no tests']:9} {c['timeout']:8} {other:6} {n:8} "
              f"{c['not checked']:8} {score}")

    for module, statuses in results.items():
        c = Counter(statuses.values())
        total += c
        row(module, c)
    row("all", total)
    if args.list:
        for module, statuses in results.items():
            for name, status in sorted(statuses.items()):
                if status in ("survived", "no tests"):
                    print(f"{status:9} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
