"""HarfBuzz 6.0, -O2, a C++ library with a C API: held out whole (issue 55).

Debian's harfbuzz source (`apt-get source harfbuzz`), built with meson
debugoptimized (-O2 -g) and frame pointers (C and C++), with GLib, FreeType and
cairo (the utilities need the first, hb-view the last; Debian's own), no tests,
docs or introspection, never installed: the utilities hb-shape, hb-subset,
hb-view and hb-ot-shape-closure find the built libharfbuzz through their build
RPATH (hb-subset also the built libharfbuzz-subset, whose calls count as the
library's).  The workloads run them on Debian's DejaVu and Liberation fonts.  The
objects: the nine types with hb_TYPE_reference/hb_TYPE_destroy in the brief
(blob, face, font, font_funcs, unicode_funcs, buffer, set, map, shape_plan);
harfbuzz/harfbuzz.yaml is the spec (pointed at the built library).

C++: the site scanner (sites.py) names a site's function right only in C
functions at file scope; in a namespace or a class body it does not, and
refcntd names C++ functions by their (mangled) symbols.  So the codebase is
`cxx`: a site counts only where its call instruction is in the code of the
function that contains it (no inlined copy), and that function's symbol is its
truth (runner.executed_sites).  Sites in src/*.hh are not scanned: a mutant
there rebuilds most of the library.

No rule of refcntd's inference was written or changed after reading any of this
codebase's answers: the rules are main's at dc0f3e0 (branch hbcairo).
"""

from __future__ import annotations

from pathlib import Path

import debian
import tracefs
import truth
from codebase import Codebase, Workload, api_probes, debian_meson
from sites import Api

HERE = Path(__file__).resolve().parent
PACKAGES = ["meson", "ninja-build", "g++", "pkg-config", "dpkg-dev", "libglib2.0-dev",
            "libfreetype-dev", "libcairo2-dev", "fonts-dejavu-core", "fonts-liberation"]
MESON = ["--buildtype=debugoptimized", "-Dc_args=-fno-omit-frame-pointer",
         "-Dcpp_args=-fno-omit-frame-pointer", "-Dglib=enabled", "-Dgobject=disabled",
         "-Dcairo=enabled", "-Dchafa=disabled", "-Dicu=disabled", "-Dgraphite=disabled",
         "-Dfreetype=enabled", "-Dtests=disabled", "-Dintrospection=disabled",
         "-Ddocs=disabled", "-Dbenchmark=disabled"]
TYPES = ("blob", "face", "font", "font_funcs", "unicode_funcs", "buffer", "set", "map",
         "shape_plan")
GETS = frozenset(f"hb_{t}_reference" for t in TYPES)
PUTS = frozenset(f"hb_{t}_destroy" for t in TYPES)
TYPE = {f"hb_{t}_{op}": f"hb_{t}_t" for t in TYPES for op in ("reference", "destroy")}
# the functions that make each object (hb_object_create inlined into them), as the
# spec names them: the other constructors call these
CONSTRUCTORS = (("hb_blob_t", "hb_blob_create_or_fail"),
                ("hb_face_t", "hb_face_create_for_tables"),
                ("hb_font_t", "hb_font_create"), ("hb_font_t", "hb_font_create_sub_font"),
                ("hb_font_funcs_t", "hb_font_funcs_create"),
                ("hb_unicode_funcs_t", "hb_unicode_funcs_create"),
                ("hb_buffer_t", "hb_buffer_create"), ("hb_set_t", "hb_set_create"),
                ("hb_map_t", "hb_map_create"), ("hb_shape_plan_t", "hb_shape_plan_create2"))
TOOLS = ("hb-shape", "hb-subset", "hb-view", "hb-ot-shape-closure")
DEJAVU = "/usr/share/fonts/truetype/dejavu"
LIBERATION = "/usr/share/fonts/truetype/liberation"
GPL = "/usr/share/common-licenses/GPL-2"
ARABIC = "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645"
# (label, tool, arguments; WORK is the codebase's work directory): shaping a text
# file line by line with harfbuzz's own font functions and with FreeType's, features
# and JSON with extents, Arabic (the Arabic shaper, GSUB/GPOS), a subset by text and
# by Unicode ranges, a rendered PNG and a glyph closure.  One process each, no
# randomness; each ends by itself in a few seconds
WORKLOADS = (
    ("hb-shape ot text file", "hb-shape", ("--font-funcs=ot", f"--text-file={GPL}",
                                           "-o", "/dev/null", f"{DEJAVU}/DejaVuSans.ttf")),
    ("hb-shape ft features json", "hb-shape",
     ("--font-funcs=ft", "--features=-liga,+kern,smcp", "--show-extents",
      "--output-format=json", f"--text-file={GPL}", "-o", "/dev/null",
      f"{LIBERATION}/LiberationSerif-Italic.ttf")),
    ("hb-shape arabic", "hb-shape", ("--direction=rtl", "--script=arab", "--language=ar",
                                     "--show-flags", f"{DEJAVU}/DejaVuSans.ttf", ARABIC)),
    ("hb-subset text", "hb-subset", (f"{DEJAVU}/DejaVuSerif.ttf", "--text=Hello mutants",
                                     "-o", "WORK/subset-text.ttf")),
    ("hb-subset unicodes", "hb-subset", (f"{DEJAVU}/DejaVuSans.ttf",
                                         "--unicodes=20-7e,a0-17f,391-3c9",
                                         "--layout-features=*", "--retain-gids",
                                         "-o", "WORK/subset-unicodes.ttf")),
    ("hb-view png", "hb-view", ("--font-size=24", "--output-format=png",
                                "-o", "WORK/view.png", f"{DEJAVU}/DejaVuSans.ttf",
                                "Hello, mutants: \u0391\u03b2\u03b3 fi ffl")),
    ("hb-ot-shape-closure", "hb-ot-shape-closure", (f"{DEJAVU}/DejaVuSans.ttf",
                                                    "office affine \u0391\u03b2")),
)


def codebase(out: Path) -> Codebase:
    work = out / "harfbuzz"
    build = work / "build"
    api = Api(GETS, PUTS, {}, TYPE)
    targets = {n: ("get" if n in GETS else "put") for n in GETS | PUTS}
    return Codebase(
        "harfbuzz", work, work / "src", build, api, targets,
        ["src/hb-*.cc", "util/*.cc", "util/*.hh"],
        [build / "src" / "libharfbuzz.so.0", build / "src" / "libharfbuzz-subset.so.0",
         *(build / "util" / t for t in TOOLS)],
        [Workload(label, (str(build / "util" / tool),
                          *(a.replace("WORK", str(work)) for a in args)))
         for label, tool, args in WORKLOADS],
        work / "harfbuzz-built.yaml", env={"LC_ALL": "C.UTF-8"},
        build_cmd=["ninja", "-C", str(build), *(f"util/{t}" for t in TOOLS)], cxx=True)


def prepare(cb: Codebase) -> None:
    debian.install(PACKAGES)
    steps = debian_meson(cb, "harfbuzz", MESON)
    steps["packages"] = {p: debian.version(p) for p in ("fonts-dejavu-core", "fonts-liberation",
                                                         "libcairo2")}
    spec = (HERE / "harfbuzz" / "harfbuzz.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libharfbuzz.so.0", f"library: {cb.binaries[0]}"))
    cb.prepared = steps


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The constructors' returns, and the entries of every reference and destroy.  The
    static empty objects (count 0) are returned made only on an allocation failure:
    their references and destroys are operations on objects never seen made, which
    the truth keeps apart."""
    return api_probes(cb.binaries[0].resolve(), CONSTRUCTORS, GETS, PUTS, "hb")
