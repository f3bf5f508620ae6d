#!/usr/bin/env python3
"""Per-case verdicts of several `conform --json` runs, as one Markdown table.

    python3 benches/scripts/conform_table.py NAME=RUN.json [NAME=RUN.json ...]

One row per protocol case (every case but the JSONTestSuite corpus), one column per run:
`pass`, **FAIL** or `skip` (`—` where a run did not have the case, e.g. `robust.crlf` over
HTTP). Then one row per corpus file that failed in any run. docs/CONFORMANCE.md's
"Every case" table is this script's output (benches/scripts/conform_all.sh).
"""

import json
import sys


def main() -> None:
    runs = []
    for arg in sys.argv[1:]:
        name, _, path = arg.partition("=")
        if not path:
            sys.exit(f"conform_table: expected NAME=FILE, got {arg!r}")
        with open(path) as f:
            cases = json.load(f)["cases"]
        runs.append((name, {c["name"]: c for c in cases}))
    if not runs:
        sys.exit(__doc__)
    order = []
    for _, cases in runs:
        for n in cases:
            if n not in order:
                order.append(n)
    cell = {"pass": "pass", "fail": "**FAIL**", "skip": "skip"}

    def row(n: str) -> str:
        cells = [cell.get(c[n]["verdict"], c[n]["verdict"]) if n in c else "—" for _, c in runs]
        return f"| `{n}` | " + " | ".join(cells) + " |"

    print("| case | " + " | ".join(name for name, _ in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for n in order:
        if not n.startswith("corpus."):
            print(row(n))
    corpus = [n for n in order if n.startswith("corpus.")]
    failing = [n for n in corpus if any(n in c and c[n]["verdict"] != "pass" for _, c in runs)]
    for n in failing:
        print(row(n))
    passed = len(corpus) - len(failing)
    print(f"| the other {passed} `corpus.*` files | " + " | ".join("pass" for _ in runs) + " |")


if __name__ == "__main__":
    main()
