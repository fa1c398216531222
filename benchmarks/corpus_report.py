"""Markdown for benchmarks/corpus.py: runs and false findings per family, each false
finding with its stacks, and the hand-written causes (benchmarks/corpus-notes.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

CLASSES = ("clean", "leak", "anomaly", "INCOMPLETE", "refcntd error")
NOTES = Path(__file__).resolve().parent / "corpus-notes.md"
# Suspected causes, by a pattern on a finding ("[comm, exit] kind N type at f < g ...")
# or on the run's losses and error; the first that matches a finding names its cause.
KILLED = "a process killed or ended with an error on purpose (a test's subprocess or helper " \
    "stopped at teardown): its objects are alive, LeakSanitizer only checks a normal exit"
SINGLETONS = "GIO's default singletons and loaded modules (glib.supp g-io-module-default-" \
    "singleton*, whose static names a stripped libgio does not have)"
DBUS = "GIO objects alive at exit under its D-Bus worker thread, pending GTasks, sockets " \
    "(reachable: valgrind and LeakSanitizer do not report reachable memory)"
GVARIANT = "GVariants GLib makes inside libglib (not probed, a known limit of the glib spec): " \
    "a released address reused"
SINGLETON_CTOR = "a GObject constructor returning an existing object (a singleton)"
PYGI = "PyGObject's and GIRepository's caches (these tests are Python scripts)"
CAIRO = "cairo's own surface caches (frames in libcairo's static functions)"
D2I = "d2i_X509(&x, ...) re-initialising a live X509, then puts on the replaced record"
GBYTES = "g_bytes_unref_to_data/_to_array freeing a GBytes' last reference without " \
    "g_bytes_unref (a put only when no put happens inside: the glib spec cannot say it), " \
    "its address then re-initialised"
TIMEOUT = "over 300 s under refcntd (millions of probed calls)"
OTHER = "objects the program itself makes, alive at exit (not analysed one by one)"
NO_PROBE = "no probe fired (issue 39's rule: INCOMPLETE, never clean, unless nothing of " \
    "the spec's library was loaded)"
LOST = "tracing incomplete: "  # + the run's loss, as refcntd words it
FINDING_CAUSES = [
    (re.compile(r"\] leak \d+ GBytes"), GBYTES),
    (re.compile(r"^\[[^]]*, (killed|exit [1-9])"), KILLED),
    (re.compile(r"_get_default( |$)|g_io_module_new|libgio-2\.0\.so\.0\.7400\.6\+0x7eb56"),
     SINGLETONS),
    (re.compile(r"(put|get)-after-delete (GVariant|GBytes)"), GVARIANT),
    (re.compile(r"(delete-live|double-put|negative-count) GObject"), SINGLETON_CTOR),
    (re.compile(r"_gi\.cpython|libgirepository"), PYGI),
    (re.compile(r"cairo_surface_t at libcairo"), CAIRO),
    (re.compile(r"X509|BIO|EVP_PKEY"), D2I),
    (re.compile(r"g_bus_get|g_dbus|dbus|g_socket|g_task_new|g_initable_new|g_inet_"), DBUS),
]


def causes(run: dict[str, Any]) -> list[str]:
    """The suspected causes of a false finding, most frequent first."""
    found: dict[str, int] = {}
    if run["error"].startswith("timed out"):
        found[TIMEOUT] = 1
    for loss in run["lost"]:
        cause = {"openssl": D2I, "glib": GBYTES}.get(run["spec"], SINGLETON_CTOR) \
            if loss.startswith("objects re-initialised") else \
            NO_PROBE if loss.startswith("no probe fired") else LOST + loss.split(" (")[0]
        found[cause] = found.get(cause, 0) + 1
    for finding in run["findings"]:
        cause = next((c for rx, c in FINDING_CAUSES if rx.search(finding)), OTHER)
        found[cause] = found.get(cause, 0) + 1
    return sorted(found, key=lambda c: -found[c])


def cause_table(runs: list[dict[str, Any]], before: list[dict[str, Any]] | None) -> str:
    def tally(rs: list[dict[str, Any]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in rs:
            for c in causes(r) if r["false"] else []:
                out[c] = out.get(c, 0) + 1
        return out
    now, old = tally(runs), tally(before or [])
    rows = sorted(set(now) | set(old), key=lambda c: (-old.get(c, 0), -now.get(c, 0), c))
    head = "| suspected cause | runs" + (" before | after |" if before else " |")
    lines = [head, "|---|---|" + ("---|" if before else "")]
    for c in rows:
        lines.append(f"| {c} | " + (f"{old.get(c, 0)} | " if before else "") + f"{now.get(c, 0)} |")
    return "\n".join(lines)


def family_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    families = list(dict.fromkeys(r["family"] for r in runs))
    rows = []
    for fam in [*families, "all"]:
        sel = [r for r in runs if fam in ("all", r["family"])]
        counts = [str(sum(r["cls"] == c for r in sel)) for c in CLASSES]
        kept = sum(sum(r["kept"].values()) for r in sel)
        rows.append([fam, str(len(sel)), *counts, str(sum(r["false"] for r in sel)), str(kept)])
    return rows


def table(runs: list[dict[str, Any]], before: list[dict[str, Any]] | None = None) -> str:
    head = ["family", "runs", *CLASSES, "false findings", "objects kept"]
    rows = family_rows(runs)
    if before:
        old = {r[0]: r for r in family_rows(before)}
        head.insert(-2, "false before")
        head.insert(-1, "kept before")
        rows = [[*r[:-2], old.get(r[0], ["?"] * len(r))[-2], r[-2],
                 old.get(r[0], ["?"] * len(r))[-1], r[-1]] for r in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(doc: dict[str, Any], table_only: bool = False,
                    before: dict[str, Any] | None = None) -> str:
    runs, old = doc["runs"], (before or {}).get("runs")
    if table_only:
        return table(runs, old)
    how = (f"live runs, specs of {doc['specs']}" if not doc["reevaluated"] else
           f"live runs {doc['reevaluated']}" if doc["reevaluated"].startswith("merged") else
           f"no program run: {doc['reevaluated']} classified again with the specs of "
           f"{doc['specs']}")
    out = ["# Corpus of real programs under refcntd", "",
           f"Machine: {doc['machine']}", "",
           f"`benchmarks/corpus.py{' --smoke' if doc['smoke'] else ''}`: {len(runs)} runs, "
           f"{doc['seconds']} s, {how}. A run is classified from refcntd's JSON "
           "(refcntd error > INCOMPLETE > anomaly > leak > clean); against the truth "
           "(GStreamer's leaks tracer for gst-launch-1.0; a leak where valgrind shows one, "
           "valgrind's evidence in the notes; 'nothing of the spec's library was loaded' "
           "(before issue 54: INCOMPLETE 'no probe fired') for a test script that loads no "
           "libglib; otherwise a program upstream keeps clean) it is right or a "
           "**false finding**."
           + (f" Before: the results in {doc.get('before') or 'corpus.md'}, same runs."
              if old else ""), "",
           table(runs, old), "", "Suspected causes (a run may have several):", "",
           cause_table(runs, old), ""]
    false = [r for r in runs if r["false"]]
    out += [f"## False findings ({len(false)})", ""]
    for r in false:
        truth = f", leaks tracer: {r['truth_leaks']} alive" if r["truth"] == "gst-leaks" else ""
        out.append(f"* **{r['family']}: {r['name']}** ({r['spec']}): {r['cls']}, "
                   f"{r['leaked']} leaked{truth}" + (f"; {r['error']}" if r["error"] else "")
                   + "; suspected: " + "; ".join(causes(r)))
        out += [f"  * lost: {n} x {why}" for why, n in r["lost"].items()]
        out += [f"  * {f}" for f in r["findings"][:6]]
        if len(r["findings"]) > 6:
            out.append(f"  * ... {len(r['findings']) - 6} more")
    real = [r for r in runs if r["truth"] == "leak"]
    if real:
        out += ["", f"## Runs that leak for real ({len(real)}; a true leak lost if not 'leak')",
                ""]
        out += [f"* {r['family']}: {r['name']}: {r['cls']}, {r['leaked']} leaked"
                + (" (**a true leak lost**)" if r["false"] else "") for r in real]
    kept = [r for r in runs if r["kept"]]
    if kept:
        out += ["", f"## Kept by the library ({len(kept)} runs)", ""]
        out += [f"* {r['family']}: {r['name']}: " + "; ".join(
            f"{n} x {why}" for why, n in r["kept"].items()) for r in kept]
    if NOTES.exists():
        out += ["", NOTES.read_text().strip()]
    return "\n".join(out) + "\n"
