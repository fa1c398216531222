"""Culprit accuracy benchmark (issue 15): random C programs with one known bug each.

Each scenario has its own types and functions (prefix sN_), so many of them are
batched into one program and one `refcntd run --history` (they share nothing).
Patterns: a reference handed to consumers, one consumer path forgets its put
(handover); a worker that gets twice and puts once (extra get); owners whose
constructor keeps a reference to a child, one owner's consumer forgets it
(leaked owner: the child must come out indirect); a cache whose eviction path
forgets (cache).  Random: object counts, consumer counts, getter wrapper depth,
temporary get/put pairs, which path has the bug.  Every function does some
work after its last call (no tail calls: a tail-called frame is not on any
stack, see docs/culprits.md), and the function with the bug touches
the object (a temporary get/put): one that never does leaves no trace at all.

Scores: top-1 right (a confident culprit, the right function), confidently
wrong (a confident culprit, another function, or the owner's child not
reported indirect), honest (a tie or "unknown" with its reason), missed (no
verdict at all).  Usage: benchmarks/culprits.py [--scenarios N] [--batch K]
[--seed S] [--smoke] [--out DIR].
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
REFCNTD = [sys.executable, "-m", "refcntd"]
PATTERNS = ("handover", "extra get", "leaked owner", "cache")

HEADER = r"""#include <stdlib.h>
#include "refcnt.h"
#define FN __attribute__((noinline, noipa))
volatile int sink;
#define OBJ(T, NAME)                                                          \
	struct T { atomic_t refcnt; void *held; void (*drop)(void *); int k; }; \
	FN static struct T *T##_alloc(int k)                                   \
	{                                                                     \
		struct T *o = calloc(1, sizeof(*o));                              \
		refcnt__init_as(o, refcnt, 1, NAME);                              \
		o->k = k;                                                         \
		sink++;                                                           \
		return o;                                                         \
	}                                                                     \
	FN __attribute__((unused)) static struct T *T##_get(struct T *o)      \
	{ refcnt__get(o, refcnt); sink++; return o; }                         \
	FN static void T##_put(struct T *o)                                   \
	{                                                                     \
		if (refcnt__put(o, refcnt)) {                                     \
			if (o->held)                                                  \
				o->drop(o->held);                                         \
			refcnt__exit(o, refcnt);                                      \
			free(o);                                                      \
		}                                                                 \
		sink++;                                                           \
	}
"""


@dataclass(frozen=True)
class Scenario:
    index: int
    pattern: str
    code: str
    expected: str  # the culprit function
    direct: str  # the type whose group must name it
    indirect: str = ""  # a type that must come out indirect ("" if none)


def getter_chain(p: str, t: str, depth: int) -> tuple[str, str]:
    """depth wrapper functions around T_get: (their code, the outermost's name)."""
    code, inner = "", f"{t}_get"
    for d in range(depth):
        name = f"{p}getw{d}"
        code += (f"FN static struct {t} *{name}(struct {t} *o) {{ o = {inner}(o); sink++; "
                 "return o; }\n")
        inner = name
    return code, inner


def temp_use(p: str, t: str, rng: random.Random, tag: str, always: bool = False
             ) -> tuple[str, str]:
    """Maybe a function taking a temporary reference (balanced): (code, call)."""
    if not always and rng.random() < 0.5:
        return "", ""
    name = f"{p}peek{tag}"
    code = (f"FN static void {name}(struct {t} *o) {{ {t}_get(o); sink += o->k; {t}_put(o); "
            "sink++; }\n")
    return code, f"{name}(o); "


def consumers(p: str, t: str, rng: random.Random, n: int, bad: int) -> tuple[str, list[str]]:
    """n consumer functions that put the reference handed to them; `bad` forgets."""
    code, names = "", []
    for c in range(n):
        name = f"{p}consume{c}"
        peek_code, peek = temp_use(p, t, rng, str(c), always=c == bad)
        put = "" if c == bad else f"{t}_put(o); "
        code += peek_code + f"FN static void {name}(struct {t} *o) {{ {peek}{put}sink++; }}\n"
        names.append(name)
    return code, names


def routed(p: str, t: str, rng: random.Random, max_cons: int, max_obj: int, arg: str
           ) -> tuple[int, str, str, str]:
    """Objects handed to consumers, one object to the consumer that forgets:
    (objects, consumers' code, the calls, the bad consumer).  The others go
    round-robin over the good consumers, each used at least once."""
    n_cons = rng.randint(2, max_cons)
    n_obj = rng.randint(n_cons, max_obj)
    bad, victim = rng.randrange(n_cons), rng.randrange(n_obj)
    code, names = consumers(p, t, rng, n_cons, bad)
    good = itertools.cycle([c for c in range(n_cons) if c != bad])
    order = [bad if j == victim else next(good) for j in range(n_obj)]
    calls = "".join(f"\t{names[c]}({arg.format(p=p, j=j)});\n" for j, c in enumerate(order))
    return n_obj, code, calls, names[bad]


def handover(i: int, rng: random.Random) -> Scenario:
    p, t = f"s{i}_", f"s{i}_obj"
    chain, getter = getter_chain(p, t, rng.randint(0, 2))
    n_obj, cons_code, calls, bad = routed(p, t, rng, 4, 7, "{p}produce(pool[{j}])")
    code = (f"OBJ({t}, \"{t}\")\n{chain}{cons_code}"
            f"FN static struct {t} *{p}produce(struct {t} *o) {{ o = {getter}(o); sink++; "
            "return o; }\n"
            f"FN static void {p}run(void)\n{{\n\tstruct {t} *pool[{n_obj}];\n"
            f"\tfor (int j = 0; j < {n_obj}; j++) pool[j] = {t}_alloc(j);\n{calls}"
            f"\tfor (int j = 0; j < {n_obj}; j++) {t}_put(pool[j]);\n\tsink++;\n}}\n")
    return Scenario(i, "handover", code, bad, t)


def extra_get(i: int, rng: random.Random) -> Scenario:
    p, t = f"s{i}_", f"s{i}_obj"
    n_work, n_obj = rng.randint(2, 5), rng.randint(2, 5)
    bad, victim = rng.randrange(n_work), rng.randrange(n_obj)
    chain, getter = getter_chain(p, t, rng.randint(0, 2))
    code = f"OBJ({t}, \"{t}\")\n{chain}"
    for w in range(n_work):
        extra = f"{getter}(o); " if w == bad else ""
        code += (f"FN static void {p}work{w}(struct {t} *o) {{ {getter}(o); {extra}"
                 f"sink += o->k; {t}_put(o); sink++; }}\n")
    good = [w for w in range(n_work) if w != bad]
    calls = "".join(f"\t\t{p}work{w}(o);\n" for w in good)
    code += (f"FN static void {p}run(void)\n{{\n\tfor (int j = 0; j < {n_obj}; j++) {{\n"
             f"\t\tstruct {t} *o = {t}_alloc(j);\n{calls}"
             f"\t\tif (j == {victim}) {p}work{bad}(o);\n\t\t{t}_put(o);\n\t}}\n"
             "\tsink++;\n}\n")
    return Scenario(i, "extra get", code, f"{p}work{bad}", t)


def leaked_owner(i: int, rng: random.Random) -> Scenario:
    p, t, kid = f"s{i}_", f"s{i}_own", f"s{i}_kid"
    _, cons_code, calls, bad = routed(p, t, rng, 3, 5, "{p}owner_new(c, {j})")
    code = (f"OBJ({kid}, \"{kid}\")\nOBJ({t}, \"{t}\")\n"
            f"FN static void {p}drop(void *c) {{ {kid}_put(c); }}\n{cons_code}"
            f"FN static struct {t} *{p}owner_new(struct {kid} *c, int k)\n{{\n"
            f"\tstruct {t} *o = {t}_alloc(k);\n\to->held = {kid}_get(c);\n"
            f"\to->drop = {p}drop;\n\tsink++;\n\treturn o;\n}}\n"
            f"FN static void {p}run(void)\n{{\n\tstruct {kid} *c = {kid}_alloc(0);\n{calls}"
            f"\t{kid}_put(c);\n\tsink++;\n}}\n")
    return Scenario(i, "leaked owner", code, bad, t, kid)


def cache(i: int, rng: random.Random) -> Scenario:
    p, t = f"s{i}_", f"s{i}_obj"
    slots, victim, rounds = rng.randint(2, 6), 0, rng.randint(1, 3)
    victim = rng.randrange(slots)
    code = (f"OBJ({t}, \"{t}\")\nstatic struct {t} *{p}slots[{slots}];\n"
            f"FN static void {p}insert(int s, struct {t} *o) {{ {p}slots[s] = {t}_get(o); "
            "sink++; }\n"
            f"FN static struct {t} *{p}lookup(int s) {{ struct {t} *o = {t}_get({p}slots[s]); "
            "sink++; return o; }\n"
            f"FN static void {p}user(int s) {{ struct {t} *o = {p}lookup(s); sink += o->k; "
            f"{t}_put(o); sink++; }}\n"
            f"FN static void {p}notify(struct {t} *o) {{ {t}_get(o); sink += o->k; {t}_put(o); "
            "sink++; }\n"
            f"FN static void {p}evict_ok(int s) {{ {p}notify({p}slots[s]); "
            f"{t}_put({p}slots[s]); {p}slots[s] = 0; sink++; }}\n"
            f"FN static void {p}evict_stale(int s) {{ {p}notify({p}slots[s]); "
            f"{p}slots[s] = 0; sink++; }}\n"
            f"FN static void {p}run(void)\n{{\n\tfor (int s = 0; s < {slots}; s++) {{\n"
            f"\t\tstruct {t} *o = {t}_alloc(s);\n\t\t{p}insert(s, o);\n\t\t{t}_put(o);\n\t}}\n"
            f"\tfor (int r = 0; r < {rounds}; r++)\n"
            f"\t\tfor (int s = 0; s < {slots}; s++) {p}user(s);\n"
            f"\tfor (int s = 0; s < {slots}; s++)\n"
            f"\t\tif (s == {victim}) {p}evict_stale(s); else {p}evict_ok(s);\n\tsink++;\n}}\n")
    return Scenario(i, "cache", code, f"{p}evict_stale", t)


MAKERS = {"handover": handover, "extra get": extra_get, "leaked owner": leaked_owner,
          "cache": cache}


def program(scenarios: list[Scenario], tail_calls: bool = False) -> str:
    """One program running every scenario.  tail_calls: without the work after
    each function's last call, so the compiler turns those calls into jumps."""
    runs = "".join(f"\ts{s.index}_run();\n" for s in scenarios)
    code = "\n".join(s.code for s in scenarios)
    if tail_calls:
        code = code.replace("sink++; return o; }", "return o; }").replace("sink++; }", "}")
        code = code.replace("\tsink++;\n}", "}")
    return HEADER + code + f"\nint main(void)\n{{\n{runs}\treturn 0;\n}}\n"


def build(work: Path, name: str, source: str) -> Path:
    c, exe = work / f"{name}.c", work / name
    c.write_text(source)
    stub = work / "refcnt.o"
    if not stub.exists():
        subprocess.run(["gcc", "-g", "-O2", f"-I{EXAMPLES}", "-c", str(EXAMPLES / "refcnt.c"),
                        "-o", str(stub)], check=True)
    subprocess.run(["gcc", "-g", "-O2", "-fomit-frame-pointer", "-Wall", "-Werror",
                    f"-I{EXAMPLES}", "-o", str(exe), str(c), str(stub)], check=True)
    return exe


def trace(exe: Path) -> dict[str, Any]:
    out = exe.with_suffix(".json")
    proc = subprocess.run([*REFCNTD, "run", "--history", "--json", str(out), "--", str(exe)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    if not out.exists():
        raise SystemExit(f"refcntd failed on {exe}: {proc.stderr[-2000:]}")
    (process,) = json.loads(out.read_text())["processes"]
    return dict(process)


def score(s: Scenario, groups: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """(outcome, what was reported) of one scenario."""
    found = groups.get(s.direct, [])
    if len(found) != 1 or "verdict" not in found[0]:
        return "missed", f"{len(found)} groups of {s.direct}"
    verdict = found[0]["verdict"]
    names = [c["function"] for c in found[0]["culprits"]]
    said = f"{verdict['status']}: {', '.join(names) or verdict['reason']}"
    if verdict["status"] != "culprit":
        return "honest", said
    if names[0] != s.expected:
        return "wrong", said
    if s.indirect:
        kid = groups.get(s.indirect, [])
        if len(kid) != 1 or kid[0].get("verdict", {}).get("status") != "indirect":
            return "wrong", said + f"; {s.indirect} not reported indirect"
    return "right", said


def by_type(process: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for g in process["groups"]:
        out.setdefault(g["type"], []).append(g)
    return out


def table(results: list[tuple[Scenario, str, str]]) -> str:
    kinds = ("right", "wrong", "honest", "missed")
    lines = ["| pattern | scenarios | top-1 right | confidently wrong | honest tie/unknown "
             "| missed |", "|---|---|---|---|---|---|"]
    for pattern in (*PATTERNS, "all"):
        rows = [r for r in results if pattern in ("all", r[0].pattern)]
        if not rows:
            continue
        n = len(rows)
        cells = [f"{sum(r[1] == k for r in rows)} ({100 * sum(r[1] == k for r in rows) / n:.1f} %)"
                 for k in kinds]
        lines.append(f"| {pattern} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    mem = Path("/proc/meminfo").read_text().split()[1]
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    return {"kernel": platform.release(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_gib": round(int(mem) / 2**20, 1), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def markdown(summary: dict[str, Any], text: str) -> str:
    lines = ["# Culprit accuracy on generated programs", "",
             f"Machine: {summary['machine']}", "",
             f"`benchmarks/culprits.py --scenarios {summary['scenarios']} --batch "
             f"{summary['batch']} --seed {summary['seed']}"
             f"{' --tail-calls' if summary['tail_calls'] else ''}`: "
             f"{summary['scenarios']} generated scenarios, {summary['batch']} per program "
             "and refcntd run, "
             f"{summary['seconds']} s in all.", "", text, ""]
    wrong = summary["not_right"]
    lines += ["Not top-1 right:" if wrong else "Every scenario was top-1 right.", ""]
    lines += [f"* s{w['scenario']} ({w['pattern']}): {w['outcome']}: expected "
              f"{w['expected']}; reported {w['reported']}" for w in wrong]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=200)
    ap.add_argument("--batch", type=int, default=50, help="scenarios per program / run")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="one of each pattern, one run")
    ap.add_argument("--tail-calls", action="store_true",
                    help="let the compiler turn last calls into jumps (frames vanish)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/refcntd-culprits"))
    args = ap.parse_args()
    n = len(PATTERNS) if args.smoke else args.scenarios
    rng = random.Random(args.seed)
    scenarios = [MAKERS[PATTERNS[i % len(PATTERNS)]](i, rng) for i in range(n)]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: list[tuple[Scenario, str, str]] = []
    for b in range(0, n, args.batch):
        batch = scenarios[b:b + args.batch]
        groups = by_type(trace(build(args.out, f"batch{b // args.batch}",
                                  program(batch, args.tail_calls))))
        results += [(s, *score(s, groups)) for s in batch]
    text = table(results)
    print(text)
    for s, outcome, said in results:
        if outcome != "right":
            print(f"s{s.index} {s.pattern}: {outcome}: expected {s.expected}; {said}")
    summary = {"machine": machine(), "seed": args.seed, "scenarios": n, "batch": args.batch,
               "tail_calls": args.tail_calls,
               "seconds": round(time.monotonic() - started),
               "outcomes": {k: sum(r[1] == k for r in results)
                            for k in ("right", "wrong", "honest", "missed")},
               "not_right": [{"scenario": s.index, "pattern": s.pattern, "outcome": o,
                              "expected": s.expected, "reported": said}
                             for s, o, said in results if o != "right"]}
    (args.out / "culprits.json").write_text(json.dumps(summary, indent=1))
    (args.out / "culprits.md").write_text(markdown(summary, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
