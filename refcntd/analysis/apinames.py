"""What a C function's name says: the object class it works on (`map__new2` -> map,
`gst_bin_add` -> gst_bin) and whether it hands a new reference to its caller or
makes the object it returns.  Naming conventions of real codebases (perf, GLib,
fontconfig), read where released objects leave no evidence."""

from __future__ import annotations

import functools
import re

from refcntd.analysis.pathops import START_FUNCTIONS, FuncKey


@functools.lru_cache(maxsize=1 << 16)  # called for every get/put pair's frames
def api_class(func: FuncKey) -> str:
    """The object a C function works on, by the codebase's naming: perf's
    `map__new2`/`__dsos__add` -> map/dsos, GLib's `gst_bin_add` -> gst_bin.  An
    upper-case prefix is a symbol alias, not a class: fontconfig's hidden copies
    `IA__FcConfigDestroy` and `IA__FcConfigReference` share no object (read as
    class "IA", a charset's initial reference paired with the configuration's
    teardown by affinity: benchmarks/mutants, fcxml.c:1091)."""
    name = func[1].split(".")[0].lstrip("_")
    if "__" in name:
        prefix, rest = name.split("__", 1)
        return api_class((func[0], rest)) if prefix.isupper() else prefix
    words = name.split("_")
    return "_".join(words[:2]) if len(words) > 2 else ""


# Name words of functions that return a new reference by convention (perf's
# thread__get, dsos__find_kernel_dso, machine__findnew_thread; GLib's gst_pad_get_peer,
# g_object_ref, g_strdup): a getter called once leaves no released object to learn
# it from, and was blamed as the keeper.  Not "new"/"init": a constructor keeps the
# references it takes for the object it builds.
GETTER_WORDS = frozenset({"get", "ref", "find", "findnew", "lookup", "dup", "copy", "clone"})


@functools.lru_cache(maxsize=1 << 16)
def name_words(func: FuncKey) -> list[str]:
    """The words of a C function's name (`__maps__insert_sorted.isra.0` -> maps,
    insert, sorted; fontconfig's `FcPatternDuplicate` -> fc, pattern, duplicate),
    what the naming conventions below read."""
    name = CAMEL.sub(r"\1_\2", func[1].split(".")[0])
    return [w for w in name.lower().split("_") if w]


CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def named_getter(func: FuncKey) -> bool:
    """Whether a function's name says it hands a reference to its caller."""
    return any(w in GETTER_WORDS for w in name_words(func)) and func[1] not in START_FUNCTIONS


# Name words of functions that make an object and return it (perf's dso__new_id,
# map__clone, nsinfo__alloc and the map__init inlined into map__new2; GLib's
# g_object_new; fontconfig's FcPatternDuplicate)
CONSTRUCTOR_WORDS = GETTER_WORDS | {"new", "init", "create", "alloc", "construct",
                                    "duplicate"}


def named_constructor(func: FuncKey) -> bool:
    """Whether a function's name says it makes the object it returns."""
    return bool(CONSTRUCTOR_WORDS & {w.rstrip("0123456789") for w in name_words(func)}) \
        and func[1] not in START_FUNCTIONS
