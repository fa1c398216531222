"""Suppressions in the formats people already have: valgrind `.supp` files and
LeakSanitizer's `leak:` lines, read strictly and matched against refcntd's stacks.

A stack here is a sequence of (function, module path) pairs, innermost first;
a frame no symbol covers has the function "" (matched as valgrind's `???`).

valgrind entries (`{ name / tool:kind / [extra] / frame lines }`) are matched
with valgrind's own rules: the frame lines, anchored at frame 0, must match
the stack's innermost frames in order (the stack may go on); `...` matches zero
or more frames; in `fun:` (the function) and `obj:` (the module's path) `*`
matches any run of characters, `?` any one, and `\\` escapes the next.

One adaptation, because valgrind writes its stacks from the memory allocator
and refcntd from the refcount constructor: a valgrind leak stack starts with
`malloc` (or another allocator, then the constructor's own frames), which a
refcount stack never holds.  The entry's leading run of frame lines that
match an allocator (`ALLOCATORS`, or valgrind's own preload object), that
name a constructor the spec probes at its return (not on the stack: the stack
starts at its caller), or are `...`, is taken off: after a constructor the
next line is anchored at frame 0 (its caller); after anything else it is
preceded by `...` (frames between the allocator and the constructor that
refcntd cannot see).  Everything after that run keeps valgrind's meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from refcntd.errors import ConfigError
from refcntd.inputs.files import read_text

StackLike = Sequence[tuple[str, str]]  # (function, module path), innermost first
UNKNOWN = "???"  # valgrind's name for a frame without a function or object name
ANY = "..."

# Memory allocators: the frames valgrind puts under a leaked block, never on a refcount
# stack (the constructor calls them).  g_type_create_instance allocates every GObject.
ALLOCATORS = frozenset({
    "malloc", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign",
    "aligned_alloc", "valloc", "pvalloc", "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
    "g_malloc", "g_malloc0", "g_realloc", "g_try_malloc", "g_try_malloc0", "g_try_realloc",
    "g_malloc_n", "g_malloc0_n", "g_realloc_n", "g_try_malloc_n", "g_try_malloc0_n",
    "g_try_realloc_n", "g_aligned_alloc", "g_aligned_alloc0", "g_slice_alloc",
    "g_slice_alloc0", "g_type_create_instance", "CRYPTO_malloc", "CRYPTO_zalloc",
    "CRYPTO_realloc", "CRYPTO_clear_realloc", "CRYPTO_secure_malloc", "CRYPTO_secure_zalloc",
})
VALGRIND_PRELOAD = "/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so"


def wildcard_match(pattern: str, text: str) -> bool:
    """valgrind's VG_(string_match): `*` any run, `?` any one character, `\\` escapes."""
    return _wild(pattern, text)


@lru_cache(maxsize=65536)
def _wild(pattern: str, text: str) -> bool:
    p = t = 0
    star_p, star_t = -1, 0
    while t < len(text):
        if p < len(pattern) and pattern[p] == "*":
            star_p, star_t = p, t
            p += 1
            continue
        literal, width = _literal_at(pattern, p)
        if p < len(pattern) and (literal is None or literal == text[t]):
            p, t = p + width, t + 1
        elif star_p >= 0:
            star_t += 1
            p, t = star_p + 1, star_t
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def _literal_at(pattern: str, p: int) -> tuple[str | None, int]:
    """The character pattern[p] stands for (None: `?`, any) and how many it takes."""
    if p >= len(pattern):
        return "", 1
    if pattern[p] == "?":
        return None, 1
    if pattern[p] == "\\":
        return (pattern[p + 1], 2) if p + 1 < len(pattern) else ("\0", 1)  # a trailing \ fails
    return pattern[p], 1


@dataclass(frozen=True)
class FrameLine:
    """One frame line of a valgrind entry: `fun:PATTERN`, `obj:PATTERN` or `...`."""

    kind: str  # "fun", "obj" or "..."
    pattern: str = ""

    def matches(self, frame: tuple[str, str]) -> bool:
        function, module = frame
        text = (function if self.kind == "fun" else module) or UNKNOWN
        return wildcard_match(self.pattern, text)

    def __str__(self) -> str:
        return ANY if self.kind == ANY else f"{self.kind}:{self.pattern}"


@dataclass(frozen=True)
class ValgrindEntry:
    name: str
    tools: tuple[str, ...]
    kind: str  # "Leak", "Param", "ConflictingAccess" ...
    frames: tuple[FrameLine, ...]
    path: str
    line: int  # the line of its opening brace

    @property
    def is_leak(self) -> bool:
        """A Memcheck:Leak entry: the only kind about memory nobody freed."""
        return self.kind == "Leak" and "Memcheck" in self.tools

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def parse_valgrind(text: str, path: str) -> list[ValgrindEntry]:
    """Every entry of a .supp file, each checked like valgrind checks it; a mistake is a
    ConfigError naming its line."""
    lines = [(n, raw.strip()) for n, raw in enumerate(text.splitlines(), 1)]
    lines = [(n, s) for n, s in lines if s and not s.startswith("#")]
    entries, i = [], 0
    while i < len(lines):
        entry, i = _entry(lines, i, path)
        entries.append(entry)
    return entries


def _entry(lines: list[tuple[int, str]], i: int, path: str) -> tuple[ValgrindEntry, int]:
    number, text = lines[i]
    if text != "{":
        raise ConfigError(path, number, text[:40], "expected '{' to open a suppression")
    if i + 2 >= len(lines) or "}" in (lines[i + 1][1], lines[i + 2][1]):
        raise ConfigError(path, number, "{", "a suppression needs a name and a tool:kind line")
    name, (kind_no, kind_line) = lines[i + 1][1], lines[i + 2]
    tools, sep, kind = kind_line.partition(":")
    if not sep or not tools or not kind:
        raise ConfigError(path, kind_no, kind_line[:40], "expected TOOL:KIND, e.g. Memcheck:Leak")
    j, frames = i + 3, []
    while j < len(lines) and lines[j][1] != "}":
        line_no, body = lines[j]
        frame = _frame_line(body)
        if frame is not None:
            frames.append(frame)
        elif "Memcheck" in tools and (frames or not _extra_allowed(kind, body, j - i - 3)):
            raise ConfigError(path, line_no, body[:40],
                              "expected fun:PATTERN, obj:PATTERN or '...'")
        j += 1
    if j >= len(lines):
        raise ConfigError(path, number, name, "no '}' closes this suppression")
    if not frames:
        raise ConfigError(path, lines[j][0], name, "a suppression needs at least one frame line")
    entry = ValgrindEntry(name, tuple(t.strip() for t in tools.split(",")), kind.strip(),
                          tuple(frames), path, number)
    return entry, j + 1


def parse_frame_lines(lines: Sequence[tuple[int, str]], path: str) -> tuple[FrameLine, ...]:
    """A frame list written out (a spec's `stack:`), one valgrind frame line per item."""
    frames = []
    for number, body in lines:
        frame = _frame_line(body.strip())
        if frame is None:
            raise ConfigError(path, number, body[:40], "expected fun:PATTERN, obj:PATTERN or '...'")
        frames.append(frame)
    if not frames:
        raise ConfigError(path, lines[0][0] if lines else 0, "stack", "needs at least one frame")
    return tuple(frames)


def _frame_line(body: str) -> FrameLine | None:
    if body == ANY:
        return FrameLine(ANY)
    for kind in ("fun", "obj"):
        if body.startswith(kind + ":"):
            return FrameLine(kind, body[len(kind) + 1:])
    return None


def _extra_allowed(kind: str, body: str, index: int) -> bool:
    """Lines between Memcheck:KIND and the frames: match-leak-kinds: for a leak, one extra
    line for another kind (a Param's parameter).  Other tools' entries are not read."""
    if kind == "Leak":
        return index == 0 and body.startswith("match-leak-kinds:")
    return index == 0


def load_valgrind(path: str, what: str = "suppressions") -> list[ValgrindEntry]:
    return parse_valgrind(read_text(path, what), path)


def looks_like_valgrind(text: str) -> bool:
    """A .supp file: its first line that is not blank or a comment is a lone '{'."""
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            return line == "{"
    return False


@dataclass(frozen=True)
class StackPattern:
    """A valgrind frame list as matched against a refcount stack (module docstring)."""

    lines: tuple[FrameLine, ...]
    dropped: tuple[FrameLine, ...]  # the leading run taken off

    @classmethod
    def from_lines(cls, lines: Sequence[FrameLine],
                   constructors: frozenset[str] = frozenset()) -> StackPattern:
        cut, anchored = 0, True
        while cut < len(lines):
            line = lines[cut]
            if line.kind == ANY or _is_allocator(line):
                anchored = False
            elif line.kind == "fun" and line.pattern in constructors:
                anchored = True
            else:
                break
            cut += 1
        rest = tuple(lines[cut:])
        head = () if anchored or not cut else (FrameLine(ANY),)
        return cls(head + rest, tuple(lines[:cut]))

    def matches(self, stack: StackLike) -> bool:
        return _match(self.lines, tuple(stack))


def _is_allocator(line: FrameLine) -> bool:
    if line.kind == "obj":
        return wildcard_match(line.pattern, VALGRIND_PRELOAD)
    return line.kind == "fun" and any(wildcard_match(line.pattern, a) for a in ALLOCATORS)


def _match(lines: tuple[FrameLine, ...], stack: tuple[tuple[str, str], ...]) -> bool:
    """valgrind's generic_match with matchAll=False: the lines match a prefix of stack."""
    states = {0}  # indexes into stack where lines[i:] may start
    for line in lines:
        if line.kind == ANY:
            states = set(range(min(states), len(stack) + 1)) if states else set()
        else:
            states = {j + 1 for j in states if j < len(stack) and line.matches(stack[j])}
        if not states:
            return False
    return True


def lsan_match(template: str, text: str) -> bool:
    """LeakSanitizer's TemplateMatch: `*` any run, `^` anchors the start, `$` the end,
    otherwise each piece is found as a substring, left to right (its first occurrence)."""
    if not text:
        return False
    start = template.startswith("^")
    templ = template[1:] if start else template
    pos, star = 0, False
    while templ:
        if templ[0] == "*":
            templ, start, star = templ[1:], False, True
            continue
        if templ[0] == "$":
            return pos == len(text) or star
        if pos == len(text):
            return False
        cut = min((k for k in (templ.find("*"), templ.find("$")) if k >= 0), default=len(templ))
        piece, templ = templ[:cut], templ[cut:]
        found = text.find(piece, pos)
        if found < 0 or (start and found != pos):
            return False
        pos, start, star = found + len(piece), False, False
    return True
