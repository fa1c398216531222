"""What fails a CI run: findings minus suppressions, baseline and thresholds.

A suppression file is either LeakSanitizer's lines or a valgrind .supp file:

    # comment
    leak:map__new          a function, module or source file in the stack
    leak:libfoo.so         (LeakSanitizer's matching: substring, * any, ^ and $ anchors)
    type:dso               leak groups of this type
    anomaly:double-put     anomalies of this kind, or with this in their stack

`leak:` matches the allocation stack and the culprit stacks of leak groups;
`anomaly:` the offending stack.  A .supp file's Memcheck:Leak entries match
allocation stacks as refcntd/inputs/suppressions.py says (valgrind's rules
after the allocator frames).  Suppressed findings are listed and counted,
never dropped; rules that matched nothing are reported as unused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.analysis.kinds import UNHELD
from refcntd.analysis.model import AnomalyFinding, LeakGroup, RunResult
from refcntd.errors import ConfigError, RefcntdError, UsageError
from refcntd.inputs.files import read_text
from refcntd.inputs.spec import load_spec, return_constructors
from refcntd.inputs.suppressions import (
    FrameLine,
    StackPattern,
    looks_like_valgrind,
    lsan_match,
    parse_valgrind,
)
from refcntd.outputs.runjson import load_run
from refcntd.symbolize.symbolizer import Frame

RULE_KINDS = ("leak", "type", "anomaly")
VALGRIND = "valgrind"  # a .supp file's Memcheck:Leak entry
FindingKey = tuple[str, str, tuple[str, ...]]  # (kind, type name, stack without addresses)
Size = tuple[int, int]  # a finding's (objects or occurrences, references)
FAILING, SUPPRESSED, BASELINE, UNDER_THRESHOLD = "failing", "suppressed", "in baseline", \
    "under threshold"
REACHABLE, NOT_JUDGED = "still reachable", "not judged"  # --leak-kinds (LeakSanitizer's)
LATE = "created after the scan"  # --leak-kinds: reach/scan.py's LATE


@dataclass
class Rule:
    kind: str
    pattern: str  # a valgrind entry's name
    line: int
    used: int = 0
    frames: tuple[FrameLine, ...] = ()  # a valgrind entry's frame lines
    stack: StackPattern | None = None  # those, as matched for the run's spec

    def matches(self, texts: Iterable[str]) -> bool:
        return any(lsan_match(self.pattern, t) for t in texts if t)

    def __str__(self) -> str:
        return f"{self.kind}:{self.pattern}"


@dataclass
class Finding:
    """A leak group or an anomaly, folded across the processes of a run."""

    kind: str  # "leak" or an anomaly kind
    type_name: str
    frames: tuple[Frame, ...]  # allocation stack (leak) or offending stack (anomaly)
    objects: int = 0  # leaked objects, or anomaly occurrences
    references: int = 0  # held by the leaked objects (0 for an anomaly)
    pids: list[int] = field(default_factory=list)
    groups: list[LeakGroup] = field(default_factory=list)
    anomaly: AnomalyFinding | None = None
    status: str = FAILING
    reason: str = ""  # the suppression rule, baseline or threshold that applied
    before: Size | None = None  # its size in the baseline (the larger of the good runs)
    unheld: bool = False  # its objects have references no slot holds (analysis/kinds.py)

    @property
    def key(self) -> FindingKey:
        """Stable across runs: no addresses, pids or offsets.  References held by nothing
        are a finding apart from the same site's reachable objects, in a baseline too."""
        kind = f"{self.kind}:{UNHELD}" if self.unheld else self.kind
        return (kind, self.type_name, tuple(_frame_name(f) for f in self.frames))

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(repr(self.key).encode()).hexdigest()[:32]

    @property
    def size(self) -> Size:
        return self.objects, self.references

    @property
    def grown(self) -> bool:
        """More objects, or more references, than in every good run."""
        return self.before is not None and (self.objects > self.before[0]
                                            or self.references > self.before[1])

    def growth(self) -> str:
        """`1 -> 6 objects (+5), 3 -> 1 032 references (+1 029)`: against the baseline."""
        assert self.before is not None
        unit = "objects" if self.kind == "leak" else "occurrences"
        parts = [_change(self.before[0], self.objects, unit)]
        if self.kind == "leak":
            parts.append(_change(self.before[1], self.references, "references"))
        return ", ".join(parts)

    def texts(self) -> list[str]:
        stacks = [self.frames, *(c.frames for g in self.groups for c in g.culprits)]
        return [t for frames in stacks for f in frames
                for t in (f.function, f.module, f.file)]


@dataclass
class Verdict:
    findings: list[Finding]
    unused_rules: list[Rule]
    baseline: bool = False  # judged against --baseline runs
    thresholds: bool = False  # judged with --max-leaks


    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAILING]

    def count(self, status: str) -> int:
        return sum(1 for f in self.findings if f.status == status)

    def grown(self) -> list[Finding]:
        """Failing findings the baseline has, that grew."""
        return [f for f in self.failing() if f.grown]


def _change(old: int, new: int, unit: str) -> str:
    delta = f" ({new - old:+,d})".replace(",", " ") if new != old else ""
    return f"{old:,d} -> {new:,d} {unit}".replace(",", " ") + delta


def _frame_name(f: Frame) -> str:
    return f"{Path(f.module).name}:{f.function or f.raw or hex(f.vaddr)}"


def load_suppressions(path: str) -> list[Rule]:
    text = read_text(path, "suppressions")
    if looks_like_valgrind(text):
        return [Rule(VALGRIND, e.name, e.line, frames=e.frames)
                for e in parse_valgrind(text, path) if e.is_leak]
    lines = text.splitlines()
    rules = []
    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        kind, sep, pattern = text.partition(":")
        if not sep or kind not in RULE_KINDS or not pattern.strip():
            raise ConfigError(path, number, kind or "(line)",
                              f"expected one of {', '.join(k + ':PATTERN' for k in RULE_KINDS)}")
        rules.append(Rule(kind, pattern.strip(), number))
    return rules


def parse_thresholds(items: list[str]) -> dict[str, int]:
    """--max-leaks TYPE=N (TYPE may be *): fail only above N leaked objects of TYPE."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit():
            why = "N must be a whole number" if sep and name else "no TYPE=N"
            raise UsageError(f"--max-leaks {item!r}: {why}",
                             "give TYPE=N, e.g. dso=3 or '*=0'")
        out[name] = int(value)
    return out


def collect_findings(result: RunResult) -> list[Finding]:
    """Leak groups and anomalies of every exited process, folded by their stable key."""
    found: dict[tuple[FindingKey, str], Finding] = {}
    for p in result.processes:
        if p.state == "live at detach":
            continue
        for g in p.groups:  # still reachable and late objects apart (--leak-kinds)
            apart = g.kind if g.kind in (REACHABLE, LATE, UNHELD) else ""
            f = found.setdefault((_key("leak", g.type_name, g.frames), apart),
                                 Finding("leak", g.type_name, g.frames,
                                         unheld=g.kind == UNHELD))
            f.objects += len(g.objects)
            f.references += g.references()
            f.groups.append(g)
            f.pids.append(p.pid)
        for a in p.misuse:
            f = found.setdefault((_key(a.kind, a.type_name, a.frames), ""),
                                 Finding(a.kind, a.type_name, a.frames, anomaly=a))
            f.objects += a.occurrences
            f.pids.append(p.pid)
    # leaks first, most objects first, then type and stack: the same order every run
    return sorted(found.values(), key=lambda f: (f.kind != "leak", -f.objects, f.key))


def _key(kind: str, type_name: str, frames: tuple[Frame, ...]) -> FindingKey:
    return (kind, type_name, tuple(_frame_name(f) for f in frames))


@dataclass
class Policy:
    rules: list[Rule] = field(default_factory=list)
    # each finding of the --baseline runs, with its size (the larger in any of them)
    baseline: dict[FindingKey, Size] = field(default_factory=dict)
    thresholds: dict[str, int] = field(default_factory=dict)
    old: list[RunResult] = field(default_factory=list)  # the --baseline runs, which
    # culprits are found against
    names: list[str] = field(default_factory=list)  # their files
    lsan: bool = False  # --leak-kinds: LeakSanitizer's policy (reachable, killed)
    fail_on_reachable: bool = False
    judge_killed: bool = False

    @classmethod
    def build(cls, suppressions: str | None, baselines: list[str],
              max_leaks: list[str]) -> Policy:
        old = [load_run(path, "baseline") for path in baselines]
        sizes: dict[FindingKey, Size] = {}
        for f in (f for run in old for f in collect_findings(run)):
            known = sizes.get(f.key, (0, 0))
            sizes[f.key] = (max(known[0], f.objects), max(known[1], f.references))
        rules = load_suppressions(suppressions) if suppressions else []
        return cls(rules, sizes, parse_thresholds(max_leaks), old, list(baselines))

    def other_programs(self, result: RunResult) -> list[str]:
        """A line for each baseline run of another program or spec than `result`:
        its findings are compared all the same (by type and stack), which a user
        who passed the wrong file must hear.  A program is known by its file name:
        the build before the change may sit at another path."""
        def program(run: RunResult) -> str:
            return f"{Path(run.target).name or '?'} (spec {run.spec})"
        this = program(result)
        return [f"warning: --baseline {name} is a run of {program(old)}, this one of "
                f"{this}: findings and culprits are compared with it all the same (give "
                "a run of this program on the code before the change)"
                for name, old in zip(self.names, self.old, strict=True)
                if program(old) != this]

    def evaluate(self, result: RunResult) -> Verdict:
        constructors = _return_constructors(result.spec)
        for rule in self.rules:
            if rule.kind == VALGRIND:
                rule.stack = StackPattern.from_lines(rule.frames, constructors)
        findings = collect_findings(result)
        killed = {p.pid: "killed by a signal" for p in result.processes
                  if p.exit_status.startswith("killed")}
        killed |= {p.pid: "ended by _exit without exit(), so no atexit handler "
                   "(LeakSanitizer's check) ran" for p in result.processes if p.direct_exit}
        for f in findings:
            self._classify(f)
            if self.lsan and f.status == FAILING:
                self._lsan(f, killed)
        self._apply_thresholds(findings)
        return Verdict(findings, _unused(self.rules), bool(self.old), bool(self.thresholds))

    def _classify(self, f: Finding) -> None:
        for rule in self.rules:
            if _rule_applies(rule, f):
                rule.used += 1
                f.status, f.reason = SUPPRESSED, f"suppressed by {rule} (line {rule.line})"
                return
        f.before = self.baseline.get(f.key)
        if f.grown:
            f.reason = f"grew since the baseline: {f.growth()}"
        elif f.before is not None and f.size != f.before:
            f.status, f.reason = BASELINE, f"present in the baseline, smaller now: {f.growth()}"
        elif f.before is not None:
            f.status, f.reason = BASELINE, "present in the baseline"

    def _lsan(self, f: Finding, killed: dict[int, str]) -> None:
        """Not failing, as LeakSanitizer: leaks of killed processes only (or ended by
        `_exit` without exit()), or objects all still reachable (unless --judge-killed,
        --fail-on reachable)."""
        if f.kind != "leak":
            return
        if not self.judge_killed and f.pids and all(p in killed for p in f.pids):
            why = " or ".join(sorted({killed[p] for p in f.pids}))
            f.status, f.reason = NOT_JUDGED, f"its processes were {why} " \
                "(--judge-killed judges them)"
        elif f.groups and all(g.kind == LATE for g in f.groups):
            f.status, f.reason = NOT_JUDGED, "created after the exit scan, by threads " \
                "still running as the process exited: no leak checker sees them"
        elif not self.fail_on_reachable and f.groups and \
                all(g.kind == REACHABLE for g in f.groups):
            f.status, f.reason = REACHABLE, "still reachable at exit (--fail-on reachable " \
                "fails it)"

    def _apply_thresholds(self, findings: list[Finding]) -> None:
        """Failing leaks of a type pass while their objects beyond the baseline (all of
        a new finding's, what a grown one has more) are at most the type's limit.  A
        finding that grew in references alone is not excused by a limit on objects."""
        if not self.thresholds:
            return
        per_type: dict[str, int] = {}
        for f in findings:
            if f.kind == "leak" and f.status == FAILING:
                per_type[f.type_name] = per_type.get(f.type_name, 0) + _new_objects(f)
        for f in findings:
            limit = self.thresholds.get(f.type_name, self.thresholds.get("*"))
            if f.kind == "leak" and f.status == FAILING and limit is not None and \
                    per_type[f.type_name] <= limit and _new_objects(f) > 0:
                beyond = " beyond the baseline" if self.old else ""
                f.status = UNDER_THRESHOLD
                f.reason = (f"{per_type[f.type_name]} leaked {f.type_name} objects{beyond} "
                            f"<= {limit}" + (f" ({f.reason})" if f.reason else ""))


def _new_objects(f: Finding) -> int:
    """Its objects beyond the baseline's: a threshold counts those."""
    return f.objects - (f.before[0] if f.before is not None else 0)


def _unused(rules: list[Rule]) -> list[Rule]:
    """Rules that matched nothing; a .supp file's unused entries as one line (glib.supp
    alone has 96 leak entries, most of which a given run never needs)."""
    unused = [r for r in rules if not r.used]
    entries = [r for r in unused if r.kind == VALGRIND]
    if len(entries) <= 1:
        return unused
    total = sum(1 for r in rules if r.kind == VALGRIND)
    names = ", ".join(r.pattern for r in entries[:3]) + (", ..." if len(entries) > 3 else "")
    summary = Rule(VALGRIND, f"{len(entries)} of {total} entries unused ({names})",
                   entries[0].line)
    return [r for r in unused if r.kind != VALGRIND] + [summary]


def _return_constructors(spec: str) -> frozenset[str]:
    """The run's spec's constructors probed at their return (off the allocation stack);
    none when the spec cannot be read here (a saved run from another machine)."""
    try:
        return return_constructors(load_spec(spec).roles.get("init", ()))
    except RefcntdError:
        return frozenset()


def _rule_applies(rule: Rule, f: Finding) -> bool:
    if rule.kind == VALGRIND:
        return f.kind == "leak" and rule.stack is not None and \
            rule.stack.matches([(fr.function, fr.module) for fr in f.frames])
    if rule.kind == "type":
        return f.kind == "leak" and rule.matches([f.type_name])
    if rule.kind == "leak":
        return f.kind == "leak" and rule.matches(f.texts())
    return f.kind != "leak" and (rule.matches([f.kind]) or rule.matches(f.texts()))
