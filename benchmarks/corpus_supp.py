"""Which of GLib's valgrind suppressions (glib.supp) can ever match a refcount stack
on this machine, and why the others cannot: benchmarks/results/glib-supp.md.

For each Memcheck:Leak entry: the frame list as refcntd matches it (after its
leading allocator and constructor frames, refcntd/inputs/suppressions.py), then
the first reason that rules it out here:

* static: it names a function no library of GLib (or libc) exports; Debian's
  libraries are stripped, so that frame has no name (`???`) unless debug
  symbols for it are installed (-dbgsym) or served (DEBUGINFOD_URLS);
* platform: a Windows-only function;
* plain memory: the innermost function it names makes a string, a list, a
  queue, a mutex or a type node, no object of a type the gobject or glib spec
  counts (the entry's own comment in glib.supp says what it is);
* never on a stack: a function that ends in a jump to the next (a tail call);
* shadowed: the same frames as an earlier entry once its allocator frames are
  off (malloc, calloc and realloc variants): the first entry is credited;
* otherwise it can match, and the entries the corpus (--corpus) or
  tests/bpf/test_kept_glib_supp.py saw keep objects are marked so.

Usage: benchmarks/corpus_supp.py [--corpus results/corpus.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from refcntd.inputs.spec import load_spec, return_constructors
from refcntd.inputs.suppressions import StackPattern, ValgrindEntry, load_valgrind, wildcard_match

ROOT = Path(__file__).resolve().parent.parent
GLIB_SUPP = "/usr/share/glib-2.0/valgrind/glib.supp"
LIBS = [f"/usr/lib/x86_64-linux-gnu/{n}" for n in (
    "libglib-2.0.so.0", "libgobject-2.0.so.0", "libgio-2.0.so.0", "libgmodule-2.0.so.0",
    "libgthread-2.0.so.0", "libc.so.6")]
# innermost function -> what it allocates (none of it a GObject, GHashTable, GBytes, GVariant)
PLAIN = {
    "g_type_register_static": "type nodes", "g_type_register_dynamic": "type nodes",
    "g_type_register_fundamental": "type nodes",
    "g_type_add_interface_static": "interface entries",
    "g_type_add_interface_dynamic": "interface entries",
    "g_static_mutex_get_mutex_impl": "a GMutex", "g_strdup": "a string",
    "g_build_filename": "a string", "g_build_path": "a string", "g_locale_to_utf8": "a string",
    "g_queue_new": "a GQueue", "g_get_charset": "the charset string",
    "g_async_queue_new_full": "a GAsyncQueue", "g_set_prgname": "a string",
    "g_rand_new_with_seed_array": "a GRand", "g_slist_copy": "a list",
    "g_module_open": "a GModule", "getpwnam": "libc's passwd buffer",
    "g_hash_table_resize": "a table's bucket arrays", "g_hash_table_insert": "a table's buckets",
    "g_thread_new": "a GThread", "g_once_impl": "nothing (frame 0 of a once-init)",
}
# functions that are never on a stack: they jump to the next function (a tail call)
TAIL_CALLS = {"g_get_language_names": "jumps to g_get_language_names_with_category"}
SEEN_BY_TEST = {"g_dbus_error_quark", "g-get-language_names-with-category-malloc",
                "g_io_extension_point_register", "g_socket_connection_factory_register_type"}


def exported() -> set[str]:
    names: set[str] = set()
    for lib in LIBS:
        out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True,
                             text=True, check=True).stdout
        names |= {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    return names


def verdict(entry: ValgrindEntry, pattern: StackPattern, names: set[str],
            seen: set[str], earlier: dict[str, str]) -> tuple[str, str]:
    funs = [f.pattern for f in pattern.lines if f.kind == "fun"]
    frames = " ".join(map(str, pattern.lines))
    hidden = [f for f in funs if not any(wildcard_match(f, n) for n in names)]
    if any("win32" in f for f in funs):
        return "platform", "Windows only"
    if hidden:
        return "static", f"names {', '.join(dict.fromkeys(hidden))}: not exported here"
    tail = next((f for f in funs if f in TAIL_CALLS), None)
    if tail is not None:
        return "never on a stack", f"{tail} {TAIL_CALLS[tail]} (a tail call)"
    plain = next((f for f in funs if f in PLAIN), None)
    if plain is not None:
        return "plain memory", f"{plain} makes {PLAIN[plain]}"
    if frames in earlier:
        return "shadowed", f"matches what {earlier[frames]} matches, which comes first"
    if entry.name in seen or entry.name in SEEN_BY_TEST:
        return "matches (seen)", "kept objects in the corpus or the BPF test"
    return "can match", "no run here made an object under it"


def used_entries(corpus: Path | None) -> set[str]:
    if corpus is None or not corpus.exists():
        return set()
    used: set[str] = set()
    for run in json.loads(corpus.read_text())["runs"]:
        for label in run["kept"]:
            m = re.search(r"glib\.supp: \d+ of \d+ entries used: (.*?); \d+ unused", label)
            if m:
                used |= {re.sub(r" x\d+$", "", e) for e in m.group(1).split(", ")}
    return used


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "benchmarks/results/corpus.json")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/glib-supp.md")
    args = ap.parse_args(argv)
    entries = load_valgrind(GLIB_SUPP)
    ctors = (return_constructors(load_spec("gobject").roles["init"])
             | return_constructors(load_spec("glib").roles["init"]))
    names, seen = exported(), used_entries(args.corpus)
    rows, tally, earlier = [], {}, {}
    for e in (e for e in entries if e.is_leak):
        pattern = StackPattern.from_lines(e.frames, ctors)
        kind, why = verdict(e, pattern, names, seen, earlier)
        earlier.setdefault(" ".join(map(str, pattern.lines)), e.name)
        tally[kind] = tally.get(kind, 0) + 1
        rows.append(f"| {e.name} | {e.line} | `{' '.join(map(str, pattern.lines))}` | {kind} "
                    f"| {why} |")
    others = len(entries) - sum(tally.values())
    summary = ", ".join(f"{kind}: {n}" for kind, n in sorted(tally.items()))
    text = "\n".join([
        "# GLib's glib.supp against refcount stacks", "",
        f"`benchmarks/corpus_supp.py`: {len(entries)} entries in {GLIB_SUPP} (GLib 2.74, "
        f"libglib2.0-dev), {sum(tally.values())} Memcheck:Leak, {others} for other tools or "
        f"kinds (drd, Helgrind, Memcheck:Param: not about leaks, not used). Of the leak "
        f"entries: {summary}.", "",
        "The frames column is the entry as refcntd matches it (its leading allocator "
        "frames, `...` and return-probed constructors taken off; docs/specs.md).", "",
        "| entry | line | frames matched | verdict | why |", "|---|---|---|---|---|", *rows, ""])
    args.out.write_text(text)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
