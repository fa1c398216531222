"""cairo 1.16, -O2, run by real programs that use it: held out whole (issue 55).

Debian's cairo source (`apt-get source cairo`, Debian's patches applied),
regenerated with autoreconf as Debian's build does (its patches change
configure.ac and Makefile.am), configured with Debian's backends (image, PNG,
FreeType/fontconfig, PDF, PS, SVG, tee, xlib, xcb; no GL) and built out of
tree with -O2 -g and frame pointers, never installed: only libcairo.so.2.
The workloads are Debian's own programs that use cairo, run with
LD_LIBRARY_PATH on the built library: rsvg-convert (librsvg2-bin) rendering an
SVG of the benchmark's own (gradients, a pattern, clips, a mask, group opacity,
a blur, text) to PNG, PDF and PostScript, and pango-view (pango1.0-tools)
rendering text (Latin, Greek, Arabic, bold, italic) to PNG, PDF and SVG (the
vector surfaces subset the fonts).  The objects: the seven types with
cairo_{,surface_,pattern_,font_face_,scaled_font_,region_,device_}reference
and _destroy; cairo/cairo.yaml is the spec.  cairo calls its own exported
functions through hidden INT_ aliases at the same addresses (slim_hidden_def),
so a call instruction may name either.

No rule of refcntd's inference was written or changed after reading any of this
codebase's answers: the rules are main's at dc0f3e0 (branch hbcairo).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import debian
import tracefs
import truth
from codebase import Codebase, Workload, api_probes, debian_configure
from sites import Api

HERE = Path(__file__).resolve().parent
PACKAGES = ["dpkg-dev", "autoconf", "automake", "libtool", "gtk-doc-tools", "pkg-config",
            "libfontconfig-dev", "libfreetype-dev", "libglib2.0-dev", "liblzo2-dev",
            "libpixman-1-dev", "libpng-dev", "libx11-dev", "libxcb-render0-dev",
            "libxcb-shm0-dev", "libxcb1-dev", "libxext-dev", "libxrender-dev", "zlib1g-dev",
            "librsvg2-bin", "pango1.0-tools", "fonts-dejavu-core"]
CONFIGURE = ["CFLAGS=-O2 -g -fno-omit-frame-pointer", "--prefix=/usr", "--disable-static",
             "--enable-pdf", "--enable-ps", "--enable-xlib", "--enable-png", "--enable-tee",
             "--enable-svg", "--enable-xcb", "--disable-gl", "--disable-gtk-doc",
             "--disable-silent-rules"]
KINDS = {"": "cairo_t", "surface_": "cairo_surface_t", "pattern_": "cairo_pattern_t",
         "font_face_": "cairo_font_face_t", "scaled_font_": "cairo_scaled_font_t",
         "region_": "cairo_region_t", "device_": "cairo_device_t"}
GETS = frozenset(f"cairo_{k}reference" for k in KINDS)
PUTS = frozenset(f"cairo_{k}destroy" for k in KINDS)
TYPE = {f"cairo_{k}{op}": t for k, t in KINDS.items() for op in ("reference", "destroy")}
# initialisers that set their first argument's count to 1, as the spec names them
INITS = {"cairo_t": "_cairo_init", "cairo_surface_t": "_cairo_surface_init",
         "cairo_font_face_t": "_cairo_font_face_init",
         "cairo_scaled_font_t": "_cairo_scaled_font_init", "cairo_device_t": "_cairo_device_init"}
# constructors that return a new pattern or region (those that make it themselves)
RETURNS = (("cairo_pattern_t", "_cairo_pattern_create_solid"),
           ("cairo_pattern_t", "cairo_pattern_create_for_surface"),
           ("cairo_pattern_t", "cairo_pattern_create_linear"),
           ("cairo_pattern_t", "cairo_pattern_create_radial"),
           ("cairo_pattern_t", "cairo_pattern_create_mesh"),
           ("cairo_pattern_t", "cairo_pattern_create_raster_source"),
           ("cairo_region_t", "cairo_region_create"),
           ("cairo_region_t", "cairo_region_create_rectangle"),
           ("cairo_region_t", "cairo_region_create_rectangles"),
           ("cairo_region_t", "_cairo_region_create_from_boxes"),
           ("cairo_region_t", "cairo_region_copy"))  # cairo_region_create inlined
SVG = """<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
     width="480" height="360" viewBox="0 0 480 360">
  <defs>
    <linearGradient id="lg" x1="0" y1="0" x2="1" y2="1">
      <stop offset="0" stop-color="#0a4"/><stop offset="1" stop-color="#fd0"/></linearGradient>
    <radialGradient id="rg" cx="0.5" cy="0.5" r="0.6" fx="0.3" fy="0.3">
      <stop offset="0" stop-color="#fff"/><stop offset="1" stop-color="#04a"/></radialGradient>
    <pattern id="pt" width="16" height="16" patternUnits="userSpaceOnUse">
      <rect width="8" height="8" fill="#c33"/><circle cx="12" cy="12" r="3" fill="#33c"/>
    </pattern>
    <clipPath id="cp"><circle cx="240" cy="180" r="150"/></clipPath>
    <mask id="mk"><rect width="480" height="360" fill="url(#lg)"/></mask>
    <filter id="bl"><feGaussianBlur stdDeviation="3"/></filter>
  </defs>
  <rect width="480" height="360" fill="url(#pt)"/>
  <g clip-path="url(#cp)" opacity="0.8">
    <rect x="60" y="40" width="360" height="280" rx="30" fill="url(#rg)" stroke="#222"
          stroke-width="6" stroke-dasharray="12 6"/>
    <path d="M80 300 C 160 100, 320 100, 400 300 Z" fill="url(#lg)" mask="url(#mk)"/>
  </g>
  <circle cx="400" cy="70" r="40" fill="#a0a" filter="url(#bl)"/>
  <text x="40" y="340" font-family="DejaVu Sans" font-size="28" fill="#000">Mutants
    <tspan font-weight="bold" fill="#a00">\u0391\u03b2\u03b3</tspan></text>
</svg>
"""
TEXT = ("Hello, mutants: fi ffl \u0391\u03b2\u03b3\u03b4 "
        "\u0645\u0631\u062d\u0628\u0627 <b>bold</b> <i>italic</i>")
PANGO = ("/usr/bin/pango-view", "--no-display", "-q", "--markup", "--font=DejaVu Sans 18",
         f"--text={TEXT}")
# (label, argv; WORK is the codebase's work directory).  One process each, no
# randomness; each ends by itself in a few seconds
WORKLOADS = (
    ("rsvg-convert png", ("/usr/bin/rsvg-convert", "-o", "WORK/out.png", "WORK/test.svg")),
    ("rsvg-convert pdf", ("/usr/bin/rsvg-convert", "-f", "pdf", "-o", "WORK/out.pdf",
                          "WORK/test.svg")),
    ("rsvg-convert ps", ("/usr/bin/rsvg-convert", "-f", "ps", "-o", "WORK/out.ps",
                         "WORK/test.svg")),
    ("pango-view png", (*PANGO, "-o", "WORK/pango.png")),
    ("pango-view pdf", (*PANGO, "-o", "WORK/pango.pdf")),
    ("pango-view svg", (*PANGO, "-o", "WORK/pango.svg")),
)


def codebase(out: Path) -> Codebase:
    work = out / "cairo"
    build = work / "build"
    libs = build / "src" / ".libs"
    api = Api(GETS, PUTS, {}, TYPE)
    targets = {n: ("get" if n in GETS else "put") for n in GETS | PUTS}
    targets |= {f"INT_{n}": role for n, role in targets.items()}
    return Codebase(
        "cairo", work, work / "src", build, api, targets, ["src/*.c"],
        [libs / "libcairo.so.2"],
        [Workload(label, tuple(a.replace("WORK", str(work)) for a in argv))
         for label, argv in WORKLOADS],
        work / "cairo-built.yaml", env={"LD_LIBRARY_PATH": str(libs), "LC_ALL": "C.UTF-8"},
        build_cmd=["make", "-s", "-C", str(build / "src"), "libcairo.la"])


def prepare(cb: Codebase) -> None:
    debian.install(PACKAGES)
    steps = debian_configure(cb, "cairo", CONFIGURE, autoreconf=True)  # as debian/rules
    if not cb.binaries[0].exists():
        t = time.monotonic()
        subprocess.run(["make", "-s", "-j2", "-C", str(cb.build_dir / "src"), "libcairo.la"],
                       check=True, capture_output=True)
        steps["build_s"] = round(time.monotonic() - t, 1)
    steps["rebuild_check_s"] = cb.build()
    steps["build_command"] = f"autoreconf -fi && configure {' '.join(CONFIGURE)} && make"
    steps["packages"] = {p: debian.version(p) for p in ("librsvg2-bin", "pango1.0-tools",
                                                         "fonts-dejavu-core")}
    (cb.work / "test.svg").write_text(SVG)
    steps["loaded"] = _loaded(cb)
    spec = (HERE / "cairo" / "cairo.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libcairo.so.2", f"library: {cb.binaries[0]}"))
    cb.prepared = steps


def _loaded(cb: Codebase) -> dict[str, str]:
    """The libcairo.so.2 each workload's program loads (ldd with the run's environment):
    the built one, or the benchmark stops (a mutant of a library nobody loads)."""
    found = {}
    for program in sorted({w.argv[0] for w in cb.workloads}):
        out = subprocess.run(["ldd", program], env=cb.run_env(), capture_output=True,
                             text=True, check=True).stdout
        path = next((line.split("=>")[1].split("(")[0].strip() for line in out.splitlines()
                     if "libcairo.so.2 " in line), "")
        if Path(path).resolve() != cb.binaries[0].resolve():
            raise SystemExit(f"cairo: {program} loads {path or 'no libcairo.so.2'}, "
                             f"not {cb.binaries[0]}")
        found[program] = path
    return found


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The initialisers' entries (count 1), the pattern and region constructors'
    returns, and the entries of every reference and destroy.  cairo's static objects
    (count -1) are never made: operations on them are kept apart."""
    from coverage import symbol_offsets
    lib = cb.binaries[0].resolve()
    found, rules = api_probes(lib, RETURNS, GETS, PUTS, "ca")
    at = symbol_offsets(lib, list(INITS.values()))
    for i, (type_, f) in enumerate(INITS.items()):
        found.append(tracefs.Probe(f"ca_init{i}", str(lib), at[f], "obj=%di:x64"))
        rules[f"ca_init{i}"] = truth.Rule(truth.INIT, type_)
    return found, rules
