"""Generate and build a C program as big as a real tool (perf 6.1: ~1.6M DIEs).

Every benchmark target used to be a tiny binary, so a DWARF scan that took
45 s on perf went unnoticed.  This writes many compilation units, each with
many `static inline` helpers (inlined: DW_TAG_inlined_subroutine trees),
structs from a shared header (type DIEs repeated per unit, as real headers
are) and calls to the perf refcount stubs of examples/refcnt.c.  A few units
also carry an `obj_*` API (configs/specs/example-objapi.yaml) with inlined
copies of `obj_get` in several units and a gcc clone of `obj_put` in another,
so a scan must find them spread across the whole .debug_info.

Built with `gcc -g -O2` by the benchmark itself: no download.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Shape:
    units: int  # compilation units
    helpers: int  # static inline helpers per unit
    structs: int  # struct types in the shared header

    def inlined_obj_units(self) -> tuple[int, ...]:
        """Units with an inlined copy of obj_get: first, middle, last."""
        return tuple(sorted({0, self.units // 2, self.units - 1}))


FULL = Shape(units=260, helpers=90, structs=60)  # ~1.08M DIEs
SMOKE = Shape(units=6, helpers=8, structs=6)


def header(shape: Shape) -> str:
    out = ["#include <stdlib.h>", '#include "refcnt.h"',
           "struct obj { int refs; const char *type; };"]
    for s in range(shape.structs):
        members = "".join(f" long m{m};" for m in range(24))
        out.append(f"struct s{s} {{ atomic_t refcnt;{members} struct s{s} *next; }};")
    out += ["void obj_init(struct obj *o, const char *type);",
            "int obj_put(struct obj *o, const char *why);"]
    return "\n".join(out) + "\n"


def helper(unit: int, i: int, shape: Shape) -> str:
    s = (unit + i) % shape.structs
    return (f"static inline long u{unit}_h{i}(struct s{s} *p, long a, long b)\n"
            f"{{\n\tlong t = a * {i + 3} + p->m{i % 12};\n\tlong r = t ^ (b << {i % 7});\n"
            f"\tif (r & 1) p->m{(i + 1) % 12} += r;\n\treturn r + p->m{(i + 5) % 12};\n}}\n")


def caller(unit: int, j: int, shape: Shape) -> str:
    """An out-of-line function inlining four helpers and using one stub pair."""
    s = (unit + j) % shape.structs
    calls = [f"\tacc += u{unit}_h{(j * 4 + k) % shape.helpers}((void *)p, acc, x + {k});"
             for k in range(4)]
    return (f"__attribute__((noinline)) long u{unit}_f{j}(struct s{s} *p, long x)\n{{\n"
            f"\tlong acc = x;\n\trefcnt__get(p, refcnt);\n" + "\n".join(calls) +
            "\n\trefcnt__put(p, refcnt);\n\treturn acc;\n}\n")


def unit_source(unit: int, shape: Shape) -> str:
    parts = ['#include "big.h"']
    if unit in shape.inlined_obj_units():
        parts.append("static inline __attribute__((always_inline)) void "
                     "obj_get(struct obj *o, const char *why) { if (why) o->refs++; }")
    parts += [helper(unit, i, shape) for i in range(shape.helpers)]
    nfuncs = max(1, shape.helpers // 2)
    parts += [caller(unit, j, shape) for j in range(nfuncs)]
    parts.append(_unit_entry(unit, shape, nfuncs))
    return "\n".join(parts)


def _unit_entry(unit: int, shape: Shape, nfuncs: int) -> str:
    s = unit % shape.structs
    body = [f"\tstruct s{s} *p = calloc(1, sizeof *p);", "\trefcnt__init(p, refcnt, 1);",
            "\tlong acc = 0;"]
    body += [f"\tacc += u{unit}_f{j}((void *)p, n);" for j in range(nfuncs)]
    if unit in shape.inlined_obj_units():
        body += ["\tstruct obj *o = calloc(1, sizeof *o);", '\tobj_init(o, "obj");',
                 '\tobj_get(o, "inl");', '\tif (obj_put(o, "done")) free(o);']
    body += ["\tif (refcnt__put(p, refcnt)) { refcnt__exit(p, refcnt); free(p); }",
             "\treturn acc;"]
    return f"long u{unit}_run(long n)\n{{\n" + "\n".join(body) + "\n}\n"


OBJAPI = """#include "big.h"
/* As in tests/fixtures/clones.c: every caller passes a constant `why`, so
 * gcc -fipa-cp-clone makes obj_get.constprop.N; DWARF places its arguments. */
__attribute__((noinline)) void obj_init(struct obj *o, const char *type)
{ o->refs = 1; o->type = type; }
__attribute__((noinline)) int obj_put(struct obj *o, const char *why)
{ return why && __atomic_sub_fetch(&o->refs, 1, __ATOMIC_SEQ_CST) == 0; }
__attribute__((noinline)) void obj_get(struct obj *o, const char *why)
{ if (why) __atomic_add_fetch(&o->refs, 1, __ATOMIC_SEQ_CST); }
struct obj *volatile obj_sink;
__attribute__((noinline)) void obj_churn(int n)
{
	struct obj *o = calloc(1, sizeof(*o));
	obj_init(o, "obj");
	obj_sink = o;
	for (int i = 0; i < n; i++)
		obj_get(o, "loop");
	for (int i = 0; i < n; i++)
		if (obj_put(o, "loop"))
			free(o);
}
"""


def main_source(shape: Shape) -> str:
    decls = "void obj_churn(int n);\n" + "".join(f"long u{u}_run(long n);\n"
                                                  for u in range(shape.units))
    calls = "".join(f"\t\tacc += u{u}_run(i);\n" for u in range(shape.units))
    return (f"#include <stdio.h>\n#include <stdlib.h>\n{decls}"
            "int main(int argc, char **argv)\n{\n"
            "\tlong n = argc > 1 ? atol(argv[1]) : 1, acc = 0;\n"
            f"\tfor (long i = 0; i < n; i++) {{\n{calls}\t}}\n"
            '\tprintf("%ld\\n", acc);\n\treturn 0;\n}\n')


def generate(out: Path, shape: Shape) -> list[Path]:
    """Write the sources; returns every .c file to compile."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "big.h").write_text(header(shape))
    sources = [out / "main.c", out / "objapi.c"]
    sources[0].write_text(main_source(shape))
    sources[1].write_text(OBJAPI)
    for u in range(shape.units):
        path = out / f"unit{u:04d}.c"
        path.write_text(unit_source(u, shape))
        sources.append(path)
    return sources


def build(out: Path, shape: Shape, jobs: int | None = None) -> Path:
    """Compile (in parallel, `-g -O2`) and link; reuses a finished build of the same shape."""
    exe = out / "bigprog"
    stamp = out / "shape.txt"
    if exe.exists() and stamp.exists() and stamp.read_text() == repr(shape):
        return exe
    sources = generate(out, shape) + [EXAMPLES / "refcnt.c"]
    flags = ["-g", "-O2", f"-I{EXAMPLES}", f"-I{out}", "-c"]

    def compile_one(src: Path) -> Path:
        obj = out / (src.stem + ".o")
        extra = ["-fipa-cp-clone"] if src.name == "objapi.c" else []
        subprocess.run(["gcc", *flags, *extra, "-o", str(obj), str(src)], check=True)
        return obj

    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    subprocess.run(["gcc", "-o", str(exe), *map(str, objects)], check=True)
    stamp.write_text(repr(shape))
    return exe


def count_dies(exe: Path) -> int:
    """DIEs in .debug_info, as readelf counts them (null entries excluded)."""
    proc = subprocess.Popen(["readelf", "--debug-dump=info", str(exe)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    n = sum(1 for line in proc.stdout if b"Abbrev Number: " in line
            and b"Abbrev Number: 0" not in line)
    proc.wait()
    return n
