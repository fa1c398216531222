"""A run alone (`run --history`, no baseline) on held-out mutants, per codebase (issue 41).

Reads OUT/rescored.json (the kept runs judged by the current inference) and, when
there, OUT/rescored-stripped.json (the same runs judged without the frames of
inlined functions: the inference's inputs before issue 41), and prints a markdown
table of right / tie / unknown / wrong / missed per codebase for the direct leak,
with the rate of confident wrong answers the goal bounds (at most 5 %), then every
mutant whose answer was not "unknown" in either.

Usage: benchmarks/mutants/alone.py OUT > OUT/alone.md
       benchmarks/mutants/alone.py sets LABEL=RESULTS.json[!OTHER.json|&OTHER.json] ...
The second form prints one row per set: a results JSON's scored mutants (`run`'s
mutants.json or `rescore`'s rescored.json), without those OTHER.json has (!) or
only those (&): a held-out batch beside the batch the rules were tuned on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from report import rate
from score import OUTCOMES


def scored(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    return {m["id"]: m for m in doc["mutants"] if m["status"] == "scored"}


def table(label: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    out = [f"| {label} | scored | " + " | ".join(OUTCOMES) + " | wrong rate |",
           "|---|---" + "|---" * (len(OUTCOMES) + 1) + "|"]
    for cb in sorted({m["codebase"] for m in rows.values()}) + ["all"]:
        mine = [m["outcome"] for m in rows.values() if cb in ("all", m["codebase"])]
        counts = {k: mine.count(k) for k in OUTCOMES}
        out.append(f"| {cb} | {len(mine)} | " + " | ".join(str(counts[k]) for k in OUTCOMES)
                   + f" | {rate(counts['wrong'], len(mine))} |")
    return out


def details(now: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> list[str]:
    out = ["| mutant | pattern | mutated function | inlined into | before | now | said now |",
           "|---|---|---|---|---|---|---|"]
    for key, m in sorted(now.items()):
        was = before.get(key, {}).get("outcome", "-")
        if m["outcome"] == "unknown" and was in ("unknown", "-"):
            continue
        inliner = m["symbol"] if m["symbol"] != m["function"] else ""
        out.append(f"| `{key}` | {m['pattern']} | `{m['function']}` | {inliner} | {was} | "
                   f"{m['outcome']} | {m.get('said', '')[:110]} |")
    return out


def chosen(spec: str) -> tuple[str, list[dict[str, Any]]]:
    """LABEL=RESULTS.json[!OTHER.json|&OTHER.json]: the set's label and scored rows."""
    label, _, paths = spec.partition("=")
    for op in "!&":
        if op in paths:
            path, other = paths.split(op, 1)
            ids = set(scored(Path(other)))
            rows = scored(Path(path))
            return label, [m for k, m in rows.items() if (k in ids) == (op == "&")]
    return label, list(scored(Path(paths)).values())


def sets(specs: list[str]) -> list[str]:
    out = ["| set | scored | " + " | ".join(OUTCOMES) + " | wrong rate |",
           "|---|---" + "|---" * (len(OUTCOMES) + 1) + "|"]
    for spec in specs:
        label, rows = chosen(spec)
        counts = {k: sum(m["outcome"] == k for m in rows) for k in OUTCOMES}
        out.append(f"| {label} | {len(rows)} | " + " | ".join(str(counts[k]) for k in OUTCOMES)
                   + f" | {rate(counts['wrong'], len(rows))} |")
    return out


def main(out: Path) -> int:
    now, before = scored(out / "rescored.json"), scored(out / "rescored-stripped.json")
    lines = table("judged now", now)
    if before:
        lines += ["", *table("without inlined frames (before)", before)]
    lines += ["", *details(now, before)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "sets":
        print("\n".join(sets(sys.argv[2:])))
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1])))
