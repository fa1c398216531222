"""Call sites of a get/put API in real C source, and the mutants made from them.

A small C scanner, not a parser: comments, strings, character literals and
preprocessor lines are blanked out (same length, so offsets and lines stay),
braces give the nesting depth, and a name followed by `(` inside a
function body (depth > 0) is a call.  The enclosing function is the last
identifier before the `(` of the parameter list that opened depth 1.  Calls
inside macros are not sites (one macro is many sites).

Mutants, one per site:
* put deleted: `x__put(e)` becomes `((void)(e))` (the argument is still
  evaluated, so a reference it returns is still taken); a "clear" put that
  sets the pointer to NULL (`dso__zput(d)`, `gst_clear_object(&o)`) keeps
  that: `((d) = NULL)`, `((void)(*(&o) = NULL))`.
* get added: `x__get(e)` becomes `x__get(x__get(e))`: one more reference,
  taken at the same place, the object evaluated once.  A get that returns
  nothing (fontconfig's `FcPatternReference`) becomes `(x_ref(e), x_ref(e))`:
  the object expression evaluated twice, which the sites of such gets (a
  variable or a field) allow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

IDENT = re.compile(r"[A-Za-z_]\w*")
PUT_DELETED = "put deleted"
GET_ADDED = "get added"


@dataclass(frozen=True)
class Api:
    """The API of one codebase: names by role, and how each clear-put is written."""

    gets: frozenset[str]
    puts: frozenset[str]
    clears: dict[str, str]  # name -> "lvalue" (zput(x)) or "pointer" (clear(&x))
    type_of: dict[str, str]  # name -> object type as the truth counts it
    void_gets: frozenset[str] = frozenset()  # gets that return nothing


@dataclass(frozen=True)
class Site:
    file: str  # relative to the source root
    line: int
    col: int
    start: int  # offset of the name
    end: int  # offset after the closing parenthesis
    name: str
    function: str
    arg: str

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


def blank(text: str) -> str:
    """Comments, strings, char literals and preprocessor lines as spaces."""
    out = list(text)
    i, n, line_start = 0, len(text), True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            _spaces(out, i, j)
            i = j
            continue
        if c in " \t":
            i += 1
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        _spaces(out, i, j)
        i = j
    return "".join(out)


def _spaces(out: list[str], i: int, j: int) -> None:
    for k in range(i, min(j, len(out))):
        if out[k] != "\n":
            out[k] = " "


def closing(code: str, open_at: int) -> int:
    """Offset after the parenthesis matching code[open_at] == '('."""
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "(":
            depth += 1
        elif code[k] == ")":
            depth -= 1
            if depth == 0:
                return k + 1
    return -1


def find_sites(root: Path, rel: str, names: frozenset[str]) -> list[Site]:
    text = (root / rel).read_text(errors="replace")
    code = blank(text)
    sites: list[Site] = []
    depth, function, last_call_name = 0, "", ""
    parens = 0  # at file scope: a name inside a parameter list (a function pointer
    # parameter's return type, `FcBool (*callback) (...)`) names no function
    i = 0
    while i < len(code):
        c = code[i]
        if c == "{":
            if depth == 0:
                function = last_call_name
            depth += 1
        elif c == "}":
            depth = max(0, depth - 1)
        elif c in "()" and depth == 0:
            parens = max(0, parens + (1 if c == "(" else -1))
        elif c.isalpha() or c == "_":
            m = IDENT.match(code, i)
            assert m is not None
            word, i = m.group(), m.end()
            paren = _next_paren(code, i)
            if paren >= 0 and depth == 0 and parens == 0:
                last_call_name = word
            elif depth == 0 and parens == 1 and _parenthesized_name(code, m.start(), i):
                last_call_name = word  # `(g_object_ref) (gpointer o)`: not the macro
            elif paren >= 0 and word in names and function:
                end = closing(code, paren)
                if end > 0:
                    line = text.count("\n", 0, m.start()) + 1
                    col = m.start() - text.rfind("\n", 0, m.start())
                    sites.append(Site(rel, line, col, m.start(), end, word, function,
                                      text[paren + 1:end - 1].strip()))
            continue
        i += 1
    return sites


def _parenthesized_name(code: str, start: int, end: int) -> bool:
    """The name at code[start:end] is written `(name) (`, as GLib defines the functions
    its headers also define as macros."""
    before = code[:start].rstrip()
    after = code[end:].lstrip()
    return before.endswith("(") and after.startswith(")") and _next_paren(
        code, code.index(")", end) + 1) >= 0


def _next_paren(code: str, i: int) -> int:
    j = i
    while j < len(code) and code[j] in " \t\n":
        j += 1
    return j if j < len(code) and code[j] == "(" else -1


def mutate(text: str, site: Site, pattern: str, api: Api) -> str:
    """The file's text with this one site mutated."""
    assert text[site.start:site.start + len(site.name)] == site.name
    call = text[site.start:site.end]
    if pattern == GET_ADDED and site.name in api.void_gets:
        new = f"({call}, {call})"
    elif pattern == GET_ADDED:
        new = f"{site.name}({call})"
    elif api.clears.get(site.name) == "lvalue":
        new = f"(({site.arg}) = NULL)"
    elif api.clears.get(site.name) == "pointer":
        new = f"((void)(*({site.arg}) = NULL))"
    else:
        new = f"((void)({site.arg}))"
    return text[:site.start] + new + text[site.end:]


def pattern_of(site: Site, api: Api) -> str:
    return GET_ADDED if site.name in api.gets else PUT_DELETED


def all_sites(root: Path, files: list[str], api: Api) -> list[Site]:
    names = api.gets | api.puts
    return [s for rel in files for s in find_sites(root, rel, names)]
