"""Refcount API specs: which functions create, get, put and delete objects.

A spec is data written by users (configs/specs/*.yaml); this module turns it
into frozen dataclasses after a strict check, so nothing later has to guess.
Each role is one entry or a list of entries, because real APIs create and
drop objects through several functions with different signatures.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from refcntd.errors import ConfigError, ConfigErrors, InputFileError, UsageError
from refcntd.inputs.suppressions import StackPattern, load_valgrind, parse_frame_lines
from refcntd.inputs.yamlnodes import YNode, load_yaml
from refcntd.paths import SPEC_DIR

ROLES = ("init", "get", "put", "delete", "sink", "check")
REQUIRED_ROLES = {"init", "get", "put"}
MAX_ARG = 6  # x86-64 SysV passes the first six integer arguments in registers
MAX_SDT_ARG = 12  # sys/sdt.h supports up to 12 probe arguments
MAX_DEREF = 2  # pointer loads the kernel side follows to a type name
INSIDE_LAST_PUT = ("before", "after")
UNKNOWN_OBJECTS = ("report", "count")  # operations on never-seen objects: each shown, or counted

_ARG_RE = re.compile(r"^arg([1-9][0-9]*)$")


@dataclass(frozen=True)
class Source:
    """Where a value comes from: an argument (1-based), the return value, or a constant.

    `out`: the argument points to where the function stores the object (read
    at its return); `deref`: the value is a pointer loaded from argument +
    each offset in turn (a type name inside a class structure).
    """

    arg: int = 0
    is_return: bool = False
    constant: str | int | None = None
    out: bool = False
    deref: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.is_return:
            return "return value"
        if self.out:
            return f"*argument {self.arg} at return"
        if self.arg:
            chain = "".join(f" -> +{off}" for off in self.deref)
            return f"argument {self.arg}{chain}"
        return repr(self.constant)

    @property
    def at_return(self) -> bool:
        """Read when the function returns (a return probe, arguments saved at entry)."""
        return self.is_return or self.out


EXISTING_MODES = ("get", "counted")
GTYPE_INSTANCE = "instance"
GTYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_+-]{2,127}")  # GLib's check_type_name_I


@dataclass(frozen=True)
class KeptFlag:
    """A `class:`'s `may_be_leaked: {is_a: T, offset: N, mask: M}`: an object whose class
    is-a GType T carries the library's "may be leaked" flag in the 32-bit word at +N
    under M.  Read where refcntd reads the process anyway (the exit scan, GET /leaks),
    not by a probe per call (a `check` role): the object is then set aside as that
    probe would (kernel/objects.py set_aside)."""

    is_a: str
    offset: int
    mask: int


@dataclass(frozen=True)
class ClassSource:
    """Where an object's class is in its memory (an init's `class:`), read at the
    leak-kinds scan (refcntd/reach/gtypes.py): `{gtype: instance}`, a GTypeInstance
    (a GObject: its first word is its class, whose first word is the GType);
    `{gtype: N}`, a GType stored at offset N (GstMiniObject.type: 0)."""

    instance: bool = False
    offset: int = 0
    kept: KeptFlag | None = None  # the library's "may be leaked" flag, read at the scan

    def describe(self) -> str:
        return "its GType's name (GTypeInstance)" if self.instance else \
            f"the name of the GType at +{self.offset}"


@dataclass(frozen=True)
class ExistingReturn:
    """A constructor that may return an object already live (`may_return_existing`):
    that object, not a new one.  `get`: the return is a reference the constructor
    took without a probed get (a singleton accessor that bumps its own count);
    otherwise a probed get inside it already counted the reference (GObject's
    constructor returning g_object_ref(singleton)), or the caller's own reference
    comes back (`reused_arg`: d2i_X509(&x, ...) decodes into *argN and returns it,
    and drops it when it fails)."""

    get: bool = False
    reused_arg: int = 0  # 0: any live object returned; N: only the one *argN held at entry

    def describe(self) -> str:
        if self.reused_arg:
            return (f"the object *argument {self.reused_arg} held at entry, decoded into and "
                    "handed back (no count change); another return (a failure) drops it "
                    "(a put)")
        if self.get:
            return "a live object returned is that object, and the return is a get on it"
        return ("a live object returned is that object, its reference already counted by a "
                "probed get inside the constructor (no count change)")


@dataclass(frozen=True)
class RoleSpec:
    """One entry of a role (init/get/put/delete/sink) of a refcount API."""

    role: str
    functions: tuple[str, ...]  # empty for a USDT role
    library: str | None  # None: the traced executable
    usdt: str | None = None  # "provider:name" instead of functions
    obj: Source = Source()
    type_name: Source | None = None  # init only
    initial_count: Source | None = None  # init only
    frees_at_zero: bool = False  # put: the put to 0 ends life even with a delete role
    absorbs_put: bool = False  # put: this thread's put on the object inside it is part of it
    inside_last_put: str | None = None  # delete: "before" / "after" the last put's own probe
    floating_flag: tuple[int, int] | None = None  # sink: (offset in the object, bit mask)
    static_if: tuple[int, int] | None = None  # (offset, value): the library's static objects
    quiet_unknown: bool = False  # the spec's unknown_objects: count
    may_be_leaked: tuple[int, int] | None = None  # get/put: the library's (offset, mask) flag
    revives: bool = False  # get: the object this thread's last put released comes back
    unless_scanned: bool = False  # check: not probed where processes are scanned at exit
    #                               (the scan reads the flag: a class's may_be_leaked)
    may_return_existing: ExistingReturn | None = None  # init at return: see ExistingReturn
    class_source: ClassSource | None = None  # init: the object's class, read at the scan
    # functions of this entry that call or jump to one of these in the traced build are
    # not probed there (the object or reference is counted in the one they reach)
    skip_if_calls: tuple[str, ...] = ()
    # (file, line, key) of each function name, so that a name the binary lacks is
    # reported where the user wrote it
    written_at: tuple[tuple[str, int, str], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class KeptStack:
    """One stack pattern of a kept rule: a valgrind Memcheck:Leak entry, or a rule's own
    `stack:` list (named after the rule's line)."""

    name: str  # the valgrind entry's name, or "stack" for an inline list
    pattern: StackPattern
    where: str  # file:line


@dataclass(frozen=True)
class KeptRule:
    """Objects a library creates for itself and never frees on purpose (valgrind's
    default suppressions): leaked objects of `type` (None: any) whose
    constructor's caller (the allocation stack's first frame) is a module or
    function matching one of `created_in` (fnmatch patterns), or whose
    allocation stack matches one of `stacks` (valgrind frame lists: a .supp
    file's Memcheck:Leak entries, or the rule's own `stack:`)."""

    type_name: str | None
    created_in: tuple[str, ...]
    reason: str
    stacks: tuple[KeptStack, ...] = ()
    valgrind: str | None = None  # the .supp file the stacks come from
    absent: bool = False  # `optional: true` and the .supp file is not on this machine
    other_entries: int = 0  # the file's entries for other tools or kinds, not used

    def source(self) -> str:
        """How the report names the rule's valgrind file."""
        return Path(self.valgrind or "").name


@dataclass(frozen=True)
class Spec:
    name: str
    path: str
    description: str
    roles: dict[str, tuple[RoleSpec, ...]]
    kept_by_library: tuple[KeptRule, ...] = ()
    unknown_objects: str = "report"  # "count": objects the library makes internally
    draft: bool = False  # proposed by `refcntd spec draft`, not confirmed yet
    unplaced: tuple[str, ...] = ()  # what the draft could not place
    draft_line: int = 0  # where the draft says `draft: true`

    @property
    def has_delete(self) -> bool:
        return "delete" in self.roles

    @property
    def entries(self) -> tuple[RoleSpec, ...]:
        return tuple(e for group in self.roles.values() for e in group)

    def libraries(self) -> set[str]:
        return {r.library for r in self.entries if r.library}

    def class_sources(self) -> dict[str, ClassSource]:
        """Each constant type name whose objects name their class (`class:`)."""
        return {str(r.type_name.constant): r.class_source for r in self.entries
                if r.class_source is not None and r.type_name is not None
                and r.type_name.constant is not None}

    def scanned(self) -> Spec:
        """The spec probed where each process is scanned at exit (`run` and serve's
        program targets with leak kinds): its `check` entries marked `unless_scanned`
        dropped, their flag read by the scans (a `class:`'s may_be_leaked) instead of a
        probe per call.  Where nothing is scanned at exit (--no-leak-kinds, `attach`)
        the whole spec is probed."""
        roles = {role: kept for role, group in self.roles.items()
                 if (kept := tuple(e for e in group if not e.unless_scanned))}
        return replace(self, roles=roles)

    def constant_types(self) -> set[str]:
        return {str(r.type_name.constant) for r in self.entries
                if r.type_name is not None and r.type_name.constant is not None}


def resolve_spec_path(name_or_file: str) -> Path:
    """A bundled spec name (configs/specs/NAME.yaml) or a path to a YAML file."""
    candidate = Path(name_or_file)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_file:
        return candidate
    bundled = SPEC_DIR / f"{name_or_file}.yaml"
    if not bundled.exists():
        names = ", ".join(sorted(p.stem for p in SPEC_DIR.glob("*.yaml")))
        raise UsageError(f"no bundled spec named '{name_or_file}'", f"bundled specs: {names}")
    return bundled


def load_spec(name_or_file: str = "perf-stubs", allow_draft: bool = False) -> Spec:
    """`allow_draft`: only `check` reads a draft, to explain it."""
    path = resolve_spec_path(name_or_file)
    return parse_spec(load_yaml(path, "spec"), allow_draft)


def load_specs(names: Sequence[str], allow_draft: bool = False) -> Spec:
    """`--spec` given more than once: one spec of them all (a GObject library's own API
    beside the gobject spec), as if written in one file."""
    given: dict[Path, str] = {}  # each file once, in the order given
    for name in names or ["perf-stubs"]:
        given.setdefault(resolve_spec_path(name).resolve(), name)
    specs = [load_spec(name, allow_draft) for name in given.values()]
    return specs[0] if len(specs) == 1 else compose_specs(specs)


def compose_specs(specs: Sequence[Spec]) -> Spec:
    """Every spec's roles and kept rules.  A function (or USDT probe) of one library in
    two specs is probed once: kept where the entries are the same (two bundled specs
    that both count GObjects), refused where they differ, since each call would be
    counted twice or as two roles."""
    roles: dict[str, list[RoleSpec]] = {}
    seen: dict[tuple[str | None, str], tuple[RoleSpec, Spec]] = {}
    for spec in specs:
        for entry in spec.entries:
            names = entry.functions or (entry.usdt or "",)
            earlier = [seen.get((entry.library, n)) for n in names]
            if all(e is not None and e[0] == entry for e in earlier):
                continue  # the same entry in an earlier spec
            for name, found in zip(names, earlier, strict=True):
                if found is not None:
                    path, line, key = _written_at(spec, entry, name)
                    raise ConfigError(path, line, key, f"'{name}' is also the {found[0].role} "
                                      f"function of {found[1].path} in another way: a "
                                      "function given by two specs must be given the same "
                                      "way, or by one of them")
                seen[(entry.library, name)] = (entry, spec)
            roles.setdefault(entry.role, []).append(entry)
    return Spec("+".join(s.name for s in specs), ", ".join(s.path for s in specs),
                "; ".join(s.description for s in specs if s.description),
                {role: tuple(entries) for role, entries in roles.items()},
                tuple(_unique([k for s in specs for k in s.kept_by_library])),
                "count" if all(s.unknown_objects == "count" for s in specs) else "report",
                any(s.draft for s in specs), tuple(u for s in specs for u in s.unplaced),
                next((s.draft_line for s in specs if s.draft), 0))


def _unique(rules: list[KeptRule]) -> list[KeptRule]:
    """Kept rules without repeats (two specs reading one valgrind file)."""
    out: list[KeptRule] = []
    for rule in rules:
        if rule not in out:
            out.append(rule)
    return out


def _written_at(spec: Spec, entry: RoleSpec, name: str) -> tuple[str, int, str]:
    return dict(zip(entry.functions, entry.written_at, strict=False)).get(
        name, (spec.path, 0, f"roles.{entry.role}"))


def parse_spec(root: YNode, allow_draft: bool = False) -> Spec:
    top = root.mapping({"version", "name", "description", "library", "roles", "draft",
                        "unplaced", "kept_by_library", "unknown_objects"},
                       {"version", "name", "roles"})
    top["version"].integer(1, 1)
    draft = "draft" in top and top["draft"].boolean()
    if draft and not allow_draft:
        raise top["draft"].fail("a draft from `refcntd spec draft`: confirm each role "
                                "(`refcntd check` explains it), then delete this line")
    if "unplaced" in top and not draft:
        raise top["unplaced"].fail("only a draft lists what it could not place")
    unplaced = tuple(i.string() for i in top["unplaced"].items()) if "unplaced" in top else ()
    library = _library_path(top.get("library"))
    roles_node = top["roles"].mapping(set(ROLES), REQUIRED_ROLES)
    errors: list[ConfigError] = []
    roles = {name: _collect(errors, _parse_entries, name, node, library) or ()
             for name, node in roles_node.items()}
    description = _optional_string(top.get("description")) or ""
    kept = tuple(_collect(errors, _kept_rules, top["kept_by_library"],
                          return_constructors(roles.get("init", ()))) or ()) \
        if "kept_by_library" in top else ()
    unknown = _collect(errors, _unknown_objects, top.get("unknown_objects")) or "report"
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    _one_role_per_function(roles_node, library)
    if unknown == "count":
        roles = {name: tuple(replace(e, quiet_unknown=True) for e in group)
                 for name, group in roles.items()}
    return Spec(top["name"].string(), root.path, description, roles, kept, unknown, draft,
                unplaced, top["draft"].line if draft else 0)


T = TypeVar("T")


def _collect(errors: list[ConfigError], parse: Callable[..., T], *args: Any) -> T | None:
    """parse(*args), or None with its error kept: each role entry and section is checked
    even when an earlier one is wrong, so that every mistake is reported at once."""
    try:
        return parse(*args)
    except ConfigErrors as err:
        errors.extend(err.errors)
    except ConfigError as err:
        errors.append(err)
    return None


def return_constructors(inits: tuple[RoleSpec, ...]) -> frozenset[str]:
    """Constructors probed at their return: not on the allocation stack (it starts at
    their caller), so a valgrind entry naming one anchors the next frame at frame 0."""
    return frozenset(f for e in inits if e.obj.at_return for f in e.functions)


def _kept_rules(node: YNode, constructors: frozenset[str]) -> tuple[KeptRule, ...]:
    errors: list[ConfigError] = []
    rules = [_collect(errors, _kept_rule, item, constructors) for item in node.items()]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return tuple(r for r in rules if r is not None)


KEPT_KINDS = ("created_in", "valgrind", "stack")


def _kept_rule(node: YNode, constructors: frozenset[str]) -> KeptRule:
    fields = node.mapping({"type", "reason", "optional", *KEPT_KINDS}, {"reason"})
    kinds = [k for k in KEPT_KINDS if k in fields]
    if len(kinds) != 1:
        raise node.fail("needs exactly one of created_in, valgrind, stack")
    if "optional" in fields and kinds != ["valgrind"]:
        raise fields["optional"].fail("only a valgrind file can be optional")
    type_name = fields["type"].string() if "type" in fields else None
    reason = fields["reason"].string()
    if kinds == ["valgrind"]:
        optional = "optional" in fields and fields["optional"].boolean()
        return _valgrind_rule(fields["valgrind"], type_name, reason, optional, constructors)
    if kinds == ["stack"]:
        items = list(fields["stack"].items())
        if not items:
            raise fields["stack"].fail("needs at least one frame line (fun:, obj: or ...)")
        lines = parse_frame_lines([(i.line, i.string()) for i in items], node.path)
        stack = KeptStack("stack", StackPattern.from_lines(lines, constructors),
                          f"{node.path}:{fields['stack'].line}")
        return KeptRule(type_name, (), reason, (stack,))
    patterns = tuple(item.string() for item in fields["created_in"].items())
    if not patterns:
        raise fields["created_in"].fail("needs at least one module or function pattern")
    return KeptRule(type_name, patterns, reason)


def _valgrind_rule(node: YNode, type_name: str | None, reason: str, optional: bool,
                   constructors: frozenset[str]) -> KeptRule:
    """A valgrind .supp file's Memcheck:Leak entries; an absent optional file keeps
    nothing, and says so (`check`, the report)."""
    path = os.path.abspath(node.string())
    if optional and not os.path.exists(path):
        return KeptRule(type_name, (), reason, valgrind=path, absent=True)
    try:
        entries = load_valgrind(path, "valgrind suppressions")
    except InputFileError as err:
        hint = "" if os.path.exists(path) else " (`optional: true` if it may be absent)"
        raise node.fail(f"{err}{hint}") from None
    stacks = tuple(KeptStack(e.name, StackPattern.from_lines(e.frames, constructors),
                             e.where()) for e in entries if e.is_leak)
    return KeptRule(type_name, (), reason, stacks, path,
                    other_entries=len(entries) - len(stacks))


def _optional_string(node: YNode | None) -> str | None:
    if node is None or node.is_null():
        return None
    return node.string()


def _library_path(node: YNode | None) -> str | None:
    """A soname, or a path made absolute now (bcc's compile, which runs during the
    analysis, changes the working directory for a moment): relative to the working
    directory, or else to the spec's own, so a spec kept beside its library works from
    anywhere."""
    name = _optional_string(node)
    if not name or "/" not in name or os.path.isabs(name) or node is None:
        return name
    here = os.path.abspath(name)
    beside = os.path.join(os.path.dirname(os.path.abspath(node.path)), name)
    return here if os.path.exists(here) or not os.path.exists(beside) else os.path.normpath(beside)


def _parse_entries(role: str, node: YNode, library: str | None) -> tuple[RoleSpec, ...]:
    """A role is one mapping, or a list of them (several signatures, libraries or types);
    every entry is checked, and all their errors raised together."""
    if node.is_mapping():
        return (_parse_role(role, node, library),)
    errors: list[ConfigError] = []
    parsed = [_collect(errors, _parse_role, role, item, library) for item in node.items()]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    entries = tuple(e for e in parsed if e is not None)
    if not entries:
        raise node.fail("needs at least one entry")
    return entries


def _one_role_per_function(roles_node: dict[str, YNode], library: str | None) -> None:
    """A function (or USDT probe) of one library in two roles would have each call
    counted as both, e.g. get and put: every object balanced, every leak hidden."""
    first: dict[tuple[str | None, str], tuple[str, int]] = {}
    for role, node in roles_node.items():
        for entry in [node] if node.is_mapping() else node.items():
            fields = entry.mapping(*_allowed_keys(role))
            lib = _library_path(fields.get("library")) if "library" in fields else library
            targets = list(fields["functions"].items()) if "functions" in fields else \
                [fields["usdt"]]
            for item in targets:
                seen = first.setdefault((lib, item.string()), (role, item.line))
                if seen[0] != role:
                    raise item.fail(f"'{item.string()}' is already the {seen[0]} function "
                                    f"(line {seen[1]}): one function cannot have two roles")


def _allowed_keys(role: str) -> tuple[set[str], set[str]]:
    allowed = {"functions", "usdt", "library", "object", "static_if", "unknown_objects",
               "skip_if_calls"}
    extra = {"init": {"type", "initial_count", "may_return_existing", "class"},
             "get": {"may_be_leaked", "revives"},
             "put": {"frees_at_zero", "may_be_leaked", "absorbs_inner_put"},
             "delete": {"inside_last_put"},
             "sink": {"floating_flag"}, "check": {"may_be_leaked", "unless_scanned"}}
    required = {"object"} | ({"type"} if role == "init" else set())
    required |= {"floating_flag"} if role == "sink" else set()
    required |= {"may_be_leaked"} if role == "check" else set()
    return allowed | extra.get(role, set()), required


def _parse_role(role: str, node: YNode, default_library: str | None) -> RoleSpec:
    allowed, required = _allowed_keys(role)
    fields = node.mapping(allowed, required)
    functions, usdt = _parse_target(node, fields)
    limit = MAX_SDT_ARG if usdt else MAX_ARG
    allow_return = role in ("init", "get", "check") and usdt is None
    obj = _parse_source(fields["object"], allow_return, allow_const=False, max_arg=limit)
    library = _library_path(fields.get("library")) if "library" in fields else default_library
    type_name = initial = None
    if role == "init":
        type_name = _parse_source(fields["type"], False, allow_const=True, max_arg=limit)
        if type_name.constant is not None and not isinstance(type_name.constant, str):
            raise fields["type"].fail("a constant type must be a name, e.g. {name: dso}")
        initial = (_parse_source(fields["initial_count"], False, allow_const=True, max_arg=limit)
                   if "initial_count" in fields else Source(constant=1))
    written_at = tuple((n.path, n.line, n.key) for n in fields["functions"].items()) \
        if functions else ()
    return RoleSpec(role, functions, library, usdt, obj, type_name, initial,
                    written_at=written_at,
                    frees_at_zero=fields["frees_at_zero"].boolean()
                    if "frees_at_zero" in fields else False,
                    absorbs_put=fields["absorbs_inner_put"].boolean()
                    if "absorbs_inner_put" in fields else False,
                    inside_last_put=_inside_last_put(fields.get("inside_last_put")),
                    floating_flag=_bit_flag(fields.get("floating_flag")),
                    may_be_leaked=_bit_flag(fields.get("may_be_leaked")),
                    revives=fields["revives"].boolean() if "revives" in fields else False,
                    static_if=_static_if(fields.get("static_if")),
                    may_return_existing=_existing(fields.get("may_return_existing"), obj),
                    class_source=_class_source(fields.get("class"), type_name),
                    skip_if_calls=_skip_if_calls(fields.get("skip_if_calls"), functions),
                    quiet_unknown=_unknown_objects(fields.get("unknown_objects")) == "count",
                    unless_scanned=fields["unless_scanned"].boolean()
                    if "unless_scanned" in fields else False)


def _skip_if_calls(node: YNode | None, functions: tuple[str, ...]) -> tuple[str, ...]:
    """Names whose callers among `functions` are not probed in a build where they call
    them: one spec for releases where a function did or did not hand over."""
    if node is None:
        return ()
    if not functions:
        raise node.fail("only an entry with 'functions' can skip those calling others")
    names = tuple(_symbol(item) for item in node.items())
    if not names:
        raise node.fail("needs at least one function name")
    if both := sorted(set(names) & set(functions)):
        raise node.fail(f"'{both[0]}' is one of this entry's functions: it cannot skip itself")
    return names


def _existing(node: YNode | None, obj: Source) -> ExistingReturn | None:
    """`get`, `counted`, or `{reuses: argN}`: only a constructor read at its return
    can hand back an object that exists already."""
    if node is None:
        return None
    if not obj.at_return:
        raise node.fail("only a constructor read at its return (object: return or "
                        "{out: argN}) can return an existing object")
    if not node.is_mapping():
        value = node.scalar()
        if value not in EXISTING_MODES:
            raise node.fail(f"expected one of {', '.join(EXISTING_MODES)} or {{reuses: argN}}, "
                            f"got {value!r}")
        return ExistingReturn(get=value == "get")
    arg = _arg_index(node.mapping({"reuses"}, {"reuses"})["reuses"], MAX_ARG)
    if obj.out and arg != obj.arg:
        raise node.fail(f"with object {{out: arg{obj.arg}}} the reused object is *arg{obj.arg}")
    return ExistingReturn(reused_arg=arg)


def _class_source(node: YNode | None, type_name: Source | None) -> ClassSource | None:
    """`{gtype: instance}` or `{gtype: N}`, for a constant type name only."""
    if node is None:
        return None
    if type_name is None or type_name.constant is None:
        raise node.fail("class: needs a constant type ({name: X}): the class refines it")
    fields = node.mapping({"gtype", "may_be_leaked"}, {"gtype"})
    gtype, kept = fields["gtype"], _kept_flag(fields.get("may_be_leaked"))
    if gtype.scalar() == GTYPE_INSTANCE:
        return ClassSource(instance=True, kept=kept)
    if isinstance(gtype.scalar(), str):
        raise gtype.fail(f"expected {GTYPE_INSTANCE} or an offset in 0..4096")
    offset = gtype.integer(0, 4096)
    if offset % 8:
        raise gtype.fail("a GType is 8 bytes, aligned: the offset must be a multiple of 8")
    return ClassSource(offset=offset, kept=kept)


def _kept_flag(node: YNode | None) -> KeptFlag | None:
    """{is_a: GTypeName, offset: N, mask: M}: a 32-bit word, 4-byte aligned."""
    if node is None:
        return None
    fields = node.mapping({"is_a", "offset", "mask"}, {"is_a", "offset", "mask"})
    is_a = fields["is_a"].string()
    if not GTYPE_NAME.fullmatch(is_a):
        raise fields["is_a"].fail(f"expected a GType name (letters, digits, _+-), got {is_a!r}")
    offset = fields["offset"].integer(0, 4096)
    if offset % 4:
        raise fields["offset"].fail("the flag is a 32-bit word: the offset must be a "
                                    "multiple of 4")
    return KeptFlag(is_a, offset, fields["mask"].integer(1, (1 << 32) - 1))


def _inside_last_put(node: YNode | None) -> str | None:
    if node is None:
        return None
    value = node.string()
    if value not in INSIDE_LAST_PUT:
        raise node.fail(f"expected one of {', '.join(INSIDE_LAST_PUT)}, got {value!r}")
    return value


def _bit_flag(node: YNode | None) -> tuple[int, int] | None:
    """Where the library keeps a bit of an object (floating, may be leaked):
    {offset: N, mask: M}, a 32-bit word at object + N."""
    if node is None:
        return None
    fields = node.mapping({"offset", "mask"}, {"offset", "mask"})
    mask = fields["mask"].integer(1, (1 << 32) - 1)
    return fields["offset"].integer(0, 4096), mask


def _unknown_objects(node: YNode | None) -> str | None:
    """Operations on objects never seen created: each reported (once), or only counted."""
    if node is None:
        return None
    value = node.string()
    if value not in UNKNOWN_OBJECTS:
        raise node.fail(f"expected one of {', '.join(UNKNOWN_OBJECTS)}, got {value!r}")
    return value


def _static_if(node: YNode | None) -> tuple[int, int] | None:
    """{offset: N, value: V}: objects whose int at offset N is V are the library's
    static ones (cairo's nil and solid objects have a count of -1): not counted."""
    if node is None:
        return None
    fields = node.mapping({"offset", "value"}, {"offset", "value"})
    return fields["offset"].integer(0, 4096), fields["value"].integer(-(1 << 31), (1 << 31) - 1)


def _parse_target(node: YNode, fields: dict[str, YNode]) -> tuple[tuple[str, ...], str | None]:
    """A role names functions or one USDT probe `provider:name`, not both."""
    if ("functions" in fields) == ("usdt" in fields):
        raise node.fail("give exactly one of 'functions' or 'usdt'")
    if "usdt" in fields:
        probe = fields["usdt"].string()
        if not re.fullmatch(r"[A-Za-z_]\w*:[A-Za-z_]\w*", probe):
            raise fields["usdt"].fail(f"'{probe}' is not provider:name")
        return (), probe
    functions = tuple(_symbol(item) for item in fields["functions"].items())
    if not functions:
        raise fields["functions"].fail("needs at least one function name")
    return functions, None


def _symbol(node: YNode) -> str:
    name = node.string()
    if not re.fullmatch(r"[A-Za-z_.$][A-Za-z0-9_.$@]*", name):
        raise node.fail(f"'{name}' is not a symbol name")
    return name


def _parse_mapping_source(node: YNode, allow_return: bool, allow_const: bool,
                          max_arg: int) -> Source:
    """`{arg: N}`, `{arg: N, deref: [OFF...]}` (type), `{out: argN}`, `{name: X}`."""
    keys = {"arg"} | ({"name", "deref"} if allow_const else set())
    keys |= {"out"} if allow_return else set()
    fields = node.mapping(keys)
    chosen = [k for k in ("arg", "name", "out") if k in fields]
    if len(chosen) != 1:
        raise node.fail(f"give exactly one of {sorted(keys - {'deref'})}")
    if "out" in fields:
        return Source(arg=_arg_index(fields["out"], max_arg), out=True)
    if "name" in fields:
        if "deref" in fields:
            raise fields["deref"].fail("deref applies to {arg: N}, not to a constant name")
        return Source(constant=fields["name"].string())
    deref: tuple[int, ...] = ()
    if "deref" in fields:
        deref = tuple(item.integer(0, 4096) for item in fields["deref"].items())
        if not 1 <= len(deref) <= MAX_DEREF:
            raise fields["deref"].fail(f"give 1..{MAX_DEREF} offsets")
    return Source(arg=fields["arg"].integer(1, max_arg), deref=deref)


def _arg_index(node: YNode, max_arg: int) -> int:
    value = node.scalar()
    if isinstance(value, str) and (m := _ARG_RE.match(value)):
        if 1 <= int(m.group(1)) <= max_arg:
            return int(m.group(1))
    raise node.fail(f"expected argN with N in 1..{max_arg}, got {value!r}")


def _parse_source(node: YNode, allow_return: bool, allow_const: bool,
                  max_arg: int = MAX_ARG) -> Source:
    """`argN`, `return`, an integer, or a mapping (see _parse_mapping_source)."""
    if node.is_mapping():
        return _parse_mapping_source(node, allow_return, allow_const, max_arg)
    value = node.scalar()
    if isinstance(value, str) and (m := _ARG_RE.match(value)):
        index = int(m.group(1))
        if not 1 <= index <= max_arg:
            raise node.fail(f"only arguments 1..{max_arg} can be read")
        return Source(arg=index)
    if value == "return":
        if not allow_return:
            raise node.fail("the return value cannot be used here")
        return Source(is_return=True)
    if allow_const and isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 1 << 30:
            raise node.fail(f"{value} is out of range [0, {1 << 30}]")
        return Source(constant=value)
    expected = f"argN (N in 1..{max_arg})" + (", return" if allow_return else "")
    expected += ", an integer or {name: X}" if allow_const else ""
    raise node.fail(f"expected {expected}, got {value!r}")
