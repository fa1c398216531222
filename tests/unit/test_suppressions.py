"""valgrind .supp entries and LeakSanitizer templates, matched against refcount stacks.

The matchers are checked against straight transcriptions of valgrind's
recursive `string_match_impl` and `generic_match` (matchAll=False) and of
LeakSanitizer's `TemplateMatch`, on random patterns and stacks; the one
adaptation (leading allocator and constructor frames) on examples."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refcntd.errors import ConfigError
from refcntd.inputs.suppressions import (
    ANY,
    FrameLine,
    StackPattern,
    _match,
    looks_like_valgrind,
    lsan_match,
    parse_valgrind,
    wildcard_match,
)

GLIB_SUPP = Path("/usr/share/glib-2.0/valgrind/glib.supp")
LIBGLIB = "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.6"
LIBGOBJECT = "/usr/lib/x86_64-linux-gnu/libgobject-2.0.so.0.7400.6"
SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))


# ---- references: valgrind's and LeakSanitizer's algorithms, written plainly ---------

def ref_string_match(pat: str, s: str) -> bool:
    """valgrind m_libcbase.c string_match_impl."""
    if not pat:
        return not s
    if pat[0] == "*":
        return any(ref_string_match(pat[1:], s[i:]) for i in range(len(s) + 1))
    if pat[0] == "?":
        return bool(s) and ref_string_match(pat[1:], s[1:])
    if pat[0] == "\\":
        if len(pat) == 1:
            return False  # a spurious trailing backslash
        pat = pat[1:]
    return bool(s) and s[0] == pat[0] and ref_string_match(pat[1:], s[1:])


def ref_generic_match(pats: list[FrameLine], stack: list[tuple[str, str]]) -> bool:
    """valgrind m_seqmatch.c generic_match, matchAll=False (suppressions)."""
    if not pats:
        return True  # the pattern is used up: the rest of the stack does not matter
    if pats[0].kind == ANY:
        return ref_generic_match(pats[1:], stack) or (
            bool(stack) and ref_generic_match(pats, stack[1:]))
    if not stack:
        return False
    return pats[0].matches(stack[0]) and ref_generic_match(pats[1:], stack[1:])


def ref_template_match(templ: str, s: str) -> bool:
    """sanitizer_common TemplateMatch."""
    if not s:
        return False
    start = templ.startswith("^")
    if start:
        templ = templ[1:]
    asterisk = False
    while templ:
        if templ[0] == "*":
            templ, start, asterisk = templ[1:], False, True
            continue
        if templ[0] == "$":
            return not s or asterisk
        if not s:
            return False
        ends = [k for k in (templ.find("*"), templ.find("$")) if k >= 0]
        piece = templ[:min(ends)] if ends else templ
        spos = s.find(piece)
        if spos < 0 or (start and spos != 0):
            return False
        s, templ = s[spos + len(piece):], templ[len(piece):]
        start = asterisk = False
    return True


# ---- wildcards -------------------------------------------------------------------------

texts = st.text(alphabet="ab_*?\\", max_size=7)


@SETTINGS
@given(pat=texts, s=st.text(alphabet="ab_*?\\", max_size=7))
def test_wildcards_are_valgrinds(pat, s):
    assert wildcard_match(pat, s) == ref_string_match(pat, s)


@pytest.mark.parametrize("pat,s,want", [
    ("g_type_*", "g_type_register_static", True), ("gobject_init*", "gobject_init_ctor", True),
    ("*alloc", "calloc", True), ("?alloc", "malloc", True), ("?alloc", "realloc", False),
    ("*/lib*/libc-*", "/usr/lib/libc-2.36.so", True), ("a\\*", "a*", True), ("a\\*", "ab", False),
    ("abc\\", "abc", False), ("", "", True), ("*", "", True), ("[ab]", "a", False),
])
def test_wildcard_examples(pat, s, want):
    assert wildcard_match(pat, s) is want


# ---- the frame list: valgrind's matching ------------------------------------------------

names = st.sampled_from(["f", "g", "h", "", "main"])
modules = st.sampled_from(["/lib/liba.so", "/bin/prog", ""])
frame_lines = st.one_of(
    st.just(FrameLine(ANY)),
    st.builds(FrameLine, st.just("fun"), st.sampled_from(["f", "g", "h", "*", "?", "???", "ma*"])),
    st.builds(FrameLine, st.just("obj"), st.sampled_from(["*liba*", "/bin/prog", "*", "???"])))


@SETTINGS
@given(pats=st.lists(frame_lines, max_size=6),
       stack=st.lists(st.tuples(names, modules), max_size=7))
def test_frame_lists_match_like_valgrind(pats, stack):
    assert _match(tuple(pats), tuple(stack)) == ref_generic_match(pats, stack)


def lines(*text: str) -> tuple[FrameLine, ...]:
    return tuple(FrameLine(ANY) if t == ANY else FrameLine(t[:3], t[4:]) for t in text)


def test_frame_zero_is_anchored_and_the_stack_may_go_on():
    stack = [("g", "/lib/liba.so"), ("main", "/bin/prog"), ("__libc_start_main", "/lib/libc")]
    assert _match(lines("fun:g", "fun:main"), tuple(stack))
    assert not _match(lines("fun:main"), tuple(stack))  # not frame 0
    assert _match(lines(ANY, "fun:main"), tuple(stack))
    assert _match(lines("fun:g", ANY, "fun:__libc_start_main"), tuple(stack))
    assert not _match(lines("fun:g", "fun:main", "fun:x", ANY), tuple(stack))  # stack too short
    assert _match(lines("fun:g", "fun:main", "fun:*", ANY), tuple(stack))
    assert _match(lines("obj:*/liba.so", "obj:/bin/prog"), tuple(stack))


def test_a_frame_without_a_name_is_three_question_marks():
    stack = (("", LIBGLIB), ("main", "/bin/prog"))
    assert _match(lines("fun:*", "fun:main"), stack)
    assert _match(lines("fun:???", "fun:main"), stack)
    assert not _match(lines("fun:quark_new"), stack)  # a static function in a stripped library
    assert _match(lines("obj:*libglib-2.0.so*"), stack)
    assert _match(lines("fun:*", "obj:???"), (("", LIBGLIB), ("x", "")))


# ---- the one adaptation: allocator and constructor frames -----------------------------

CTORS = frozenset({"g_hash_table_new_full", "g_object_new_with_properties"})


def adapted(*text: str) -> tuple[str, ...]:
    return tuple(map(str, StackPattern.from_lines(lines(*text), CTORS).lines))


@pytest.mark.parametrize("entry,want", [
    (("fun:malloc", ANY, "fun:g_type_register_static"), (ANY, "fun:g_type_register_static")),
    (("fun:calloc", "fun:g_private_impl_new"), (ANY, "fun:g_private_impl_new")),
    (("fun:malloc", ANY, "fun:g_hash_table_new_full", "fun:g_error_init"),
     ("fun:g_error_init",)),  # after a return-probed constructor: anchored at its caller
    (("fun:g_hash_table_new_full", ANY, "fun:quark_new"), (ANY, "fun:quark_new")),
    (("fun:g_hash_table_new", ANY, "fun:quark_new"),  # not probed: it is frame 0
     ("fun:g_hash_table_new", ANY, "fun:quark_new")),
    (("fun:g_type_create_instance", ANY, "fun:_g_io_module_get_default"),
     (ANY, "fun:_g_io_module_get_default")),
    ((ANY, "fun:g_hash_table_resize", ANY, "fun:quark_new"),
     (ANY, "fun:g_hash_table_resize", ANY, "fun:quark_new")),
    (("obj:*/vgpreload_memcheck*", "fun:f"), (ANY, "fun:f")),
    (("fun:*alloc", "fun:f"), (ANY, "fun:f")),
    (("fun:malloc",), (ANY,)),  # valgrind: every malloc leak; here every stack
    (("fun:f", "fun:malloc"), ("fun:f", "fun:malloc")),  # only a leading run is dropped
    (("fun:g_object_new_*", "fun:f"), ("fun:g_object_new_*", "fun:f")),  # a wildcard is no ctor
])
def test_leading_allocator_and_constructor_frames(entry, want):
    assert adapted(*entry) == want


def test_an_adapted_entry_on_real_stacks():
    quark = StackPattern.from_lines(lines("fun:g_hash_table_new", ANY, "fun:g_quark_from_string"))
    stack = [("g_hash_table_new", LIBGLIB), ("", LIBGLIB), ("g_quark_from_string", LIBGLIB),
             ("main", "/bin/p")]
    assert quark.matches(stack)
    assert not quark.matches(stack[1:])
    singleton = StackPattern.from_lines(lines("fun:calloc", ANY, "fun:g_vfs_get_default"), CTORS)
    assert singleton.matches([("g_object_new", LIBGOBJECT), ("", "/lib/libgio"),
                              ("g_vfs_get_default", "/lib/libgio"), ("main", "/bin/gio")])
    assert not singleton.matches([("g_object_new", LIBGOBJECT), ("main", "/bin/gio")])


# ---- reading .supp files -------------------------------------------------------------

SUPP = """# a comment
{
   first
   Memcheck:Leak
   match-leak-kinds: reachable
   fun:malloc
   ...
   fun:g_type_register_static
}

{
   param
   Memcheck:Param
   ioctl(generic)
   fun:ioctl
}
{
   race
   Helgrind:Race
   fun:g_private_get
}
"""


def test_parse_entries_kinds_and_lines():
    entries = parse_valgrind(SUPP, "t.supp")
    assert [(e.name, e.kind, e.is_leak, e.line) for e in entries] == [
        ("first", "Leak", True, 2), ("param", "Param", False, 11), ("race", "Race", False, 17)]
    assert [str(f) for f in entries[0].frames] == [
        "fun:malloc", "...", "fun:g_type_register_static"]
    assert looks_like_valgrind(SUPP) and not looks_like_valgrind("# x\nleak:foo\n")


@pytest.mark.parametrize("text,line,key", [
    ("leak:foo\n", 1, "leak:foo"),
    ("{\n a\n Memcheck:Leak\n fun:f\n", 1, "a"),  # no closing brace
    ("{\n a\n Memcheck:Leak\n fun:f\n src:x.c:3\n}\n", 5, "src:x.c:3"),
    ("{\n a\n MemcheckLeak\n fun:f\n}\n", 3, "MemcheckLeak"),
    ("{\n a\n Memcheck:Leak\n}\n", 4, "a"),  # no frame line
    ("{\n a\n}\n", 1, "{"),
    ("{\n a\n Memcheck:Leak\n match-leak-kinds: all\n}\n", 5, "a"),
])
def test_parse_errors_name_file_and_line(text, line, key):
    with pytest.raises(ConfigError) as err:
        parse_valgrind(text, "bad.supp")
    assert (err.value.path, err.value.lineno, err.value.key) == ("bad.supp", line, key)


@pytest.mark.skipif(not GLIB_SUPP.exists(), reason="libglib2.0-dev's glib.supp not installed")
def test_glibs_own_file():
    """Every entry of the installed file, counted by its lines: 140 (96 leaks) in
    Debian 12's GLib 2.74, 149 (104) in Debian 13's 2.84."""
    text = GLIB_SUPP.read_text()
    entries = parse_valgrind(text, str(GLIB_SUPP))
    lines = [line.strip() for line in text.splitlines()]
    assert len(entries) == lines.count("{") >= 140
    assert sum(e.is_leak for e in entries) == lines.count("Memcheck:Leak") >= 96


@pytest.mark.parametrize("path", sorted(Path("/usr/libexec/valgrind").glob("*.supp"))
                         + sorted(Path("/usr/lib/valgrind").glob("*.supp")))
def test_valgrinds_own_files(path):
    """Every file valgrind installs reads without a complaint (when it is installed)."""
    assert parse_valgrind(path.read_text(), str(path))


# ---- LeakSanitizer templates ----------------------------------------------------------

@SETTINGS
@given(templ=st.text(alphabet="ab^$*", max_size=6), s=st.text(alphabet="ab", max_size=6))
def test_templates_are_leaksanitizers(templ, s):
    assert lsan_match(templ, s) == ref_template_match(templ, s)


@pytest.mark.parametrize("templ,s,want", [
    ("map__new", "perf_map__new_x", True), ("^map__new", "perf_map__new", False),
    ("libfoo*", "/usr/lib/libfoo.so.1", True), ("^/usr/*libfoo.so$", "/usr/lib/libfoo.so", True),
    ("foo.c$", "src/foo.c", True), ("foo.c$", "src/foo.cc", False), ("a?c", "abc", False),
    ("", "x", True), ("x", "", False),
])
def test_template_examples(templ, s, want):
    assert lsan_match(templ, s) is want
