"""Refcount API specs: which functions create, get, put and delete objects.

A spec is data written by users (configs/specs/*.yaml); this module turns it
into frozen dataclasses after a strict check, so nothing later has to guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from refcntd.errors import UsageError
from refcntd.inputs.yamlnodes import YNode, load_yaml
from refcntd.paths import SPEC_DIR

ROLES = ("init", "get", "put", "delete")
REQUIRED_ROLES = {"init", "get", "put"}
MAX_ARG = 6  # x86-64 SysV passes the first six integer arguments in registers
MAX_SDT_ARG = 12  # sys/sdt.h supports up to 12 probe arguments

_ARG_RE = re.compile(r"^arg([1-9][0-9]*)$")


@dataclass(frozen=True)
class Source:
    """Where a value comes from: an argument (1-based), the return value, or a constant."""

    arg: int = 0
    is_return: bool = False
    constant: str | int | None = None

    def describe(self) -> str:
        if self.is_return:
            return "return value"
        if self.arg:
            return f"argument {self.arg}"
        return repr(self.constant)


@dataclass(frozen=True)
class RoleSpec:
    """One role (init/get/put/delete) of a refcount API."""

    role: str
    functions: tuple[str, ...]  # empty for a USDT role
    library: str | None  # None: the traced executable
    usdt: str | None = None  # "provider:name" instead of functions
    obj: Source = Source()
    type_name: Source | None = None  # init only
    initial_count: Source | None = None  # init only


@dataclass(frozen=True)
class Spec:
    name: str
    path: str
    description: str
    roles: dict[str, RoleSpec]

    @property
    def has_delete(self) -> bool:
        return "delete" in self.roles

    def libraries(self) -> set[str]:
        return {r.library for r in self.roles.values() if r.library}


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


def load_spec(name_or_file: str = "perf-stubs") -> Spec:
    path = resolve_spec_path(name_or_file)
    return parse_spec(load_yaml(path))


def parse_spec(root: YNode) -> Spec:
    top = root.mapping({"version", "name", "description", "library", "roles"},
                       {"version", "name", "roles"})
    top["version"].integer(1, 1)
    library = _optional_string(top.get("library"))
    roles_node = top["roles"].mapping(set(ROLES), REQUIRED_ROLES)
    roles = {name: _parse_role(name, node, library) for name, node in roles_node.items()}
    description = _optional_string(top.get("description")) or ""
    return Spec(top["name"].string(), root.path, description, roles)


def _optional_string(node: YNode | None) -> str | None:
    if node is None or node.is_null():
        return None
    return node.string()


def _parse_role(role: str, node: YNode, default_library: str | None) -> RoleSpec:
    allowed = {"functions", "usdt", "library", "object"}
    if role == "init":
        allowed |= {"type", "initial_count"}
    required = {"object"} | ({"type"} if role == "init" else set())
    fields = node.mapping(allowed, required)
    functions, usdt = _parse_target(node, fields)
    limit = MAX_SDT_ARG if usdt else MAX_ARG
    allow_return = role in ("init", "get") and usdt is None
    obj = _parse_source(fields["object"], allow_return, allow_const=False, max_arg=limit)
    library = _optional_string(fields.get("library")) if "library" in fields else default_library
    type_name = initial = None
    if role == "init":
        type_name = _parse_source(fields["type"], False, allow_const=True, max_arg=limit)
        if type_name.constant is not None and not isinstance(type_name.constant, str):
            raise fields["type"].fail("a constant type must be a name, e.g. {name: dso}")
        initial = (_parse_source(fields["initial_count"], False, allow_const=True, max_arg=limit)
                   if "initial_count" in fields else Source(constant=1))
    return RoleSpec(role, functions, library, usdt, obj, type_name, initial)


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


def _parse_source(node: YNode, allow_return: bool, allow_const: bool,
                  max_arg: int = MAX_ARG) -> Source:
    """`argN`, `return`, an integer, or `{name: X}` / `{arg: N}`."""
    if node.is_mapping():
        keys = {"arg", "name"} if allow_const else {"arg"}
        fields = node.mapping(keys)
        if len(fields) != 1:
            raise node.fail(f"give exactly one of {sorted(keys)}")
        if "arg" in fields:
            return Source(arg=fields["arg"].integer(1, max_arg))
        return Source(constant=fields["name"].string())
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
