"""Outputs CI systems read: SARIF 2.1.0, JUnit XML, GitHub Actions annotations."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO
from xml.etree import ElementTree as ET

from refcntd import __version__
from refcntd.analysis.culpritlines import last_use_line, put_line
from refcntd.analysis.model import ANOMALY_TEXT, RunResult
from refcntd.analysis.pathops import MISSING_PUT, Culprit
from refcntd.errors import UsageError
from refcntd.inputs.outputfile import output_file
from refcntd.outputs.policy import (
    BASELINE,
    FAILING,
    LATE,
    NOT_JUDGED,
    REACHABLE,
    SUPPRESSED,
    UNDER_THRESHOLD,
    Finding,
    Verdict,
)
from refcntd.outputs.report import named, short_path
from refcntd.symbolize.symbolizer import Frame
from refcntd.text import visible

SARIF_SCHEMA = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
                "sarif-schema-2.1.0.json")
INFO_URI = "https://github.com/refcntd/refcntd"
LEAK_RULE = "refcount-leak"


def title(f: Finding) -> str:
    if f.kind == "leak":
        unheld = ", a reference held by nothing" if f.unheld else ""
        return f"{f.objects} {_alive(f)} {f.type_name} object(s){_classes(f)}{unheld}{_blame(f)}"
    return f"{f.kind}: {ANOMALY_TEXT[f.kind]} ({f.type_name})"


def _classes(f: Finding) -> str:
    """` (class JsonParser)`, ` (classes GTask 2, JsonNode 1)`: what the scan read, in
    the text only (names and fingerprints keep the spec's type: the same every run)."""
    counts: dict[str, int] = {}
    for g in f.groups:
        if g.class_name:
            counts[g.class_name] = counts.get(g.class_name, 0) + len(g.objects)
    if len(counts) == 1:
        return f" (class {next(iter(counts))})"
    shown = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    more = f", {len(shown) - 4} more" if len(shown) > 4 else ""
    return f" (classes {', '.join(f'{c} {n}' for c, n in shown[:4])}{more})" if shown else ""


def _alive(f: Finding) -> str:
    """What a leak finding's objects are: "leaked", unless the exit scan found every one
    of them still reachable (or made after it), which LeakSanitizer does not call a leak."""
    kinds = {g.kind for g in f.groups}
    return kinds.pop() if kinds in ({REACHABLE}, {LATE}) else "leaked"


def _blame(f: Finding) -> str:
    """` (missing put in f)`: a leak's culprit, when one is named."""
    culprit = f.groups[0].culprits[0] if f.groups and f.groups[0].culprits else None
    return (f" ({culprit.kind} in {culprit.function.function}, named by {culprit.evidence})"
            if culprit else "")


def case_name(f: Finding) -> str:
    """A JUnit case name that follows a leak site across runs: kind, type and allocating
    function chain (innermost first), no counts; the fingerprint tells apart sites whose
    first frames agree."""
    unheld = " (reference held by nothing)" if f.unheld else ""
    return f"{f.kind}{unheld} {f.type_name} at {_chain(f.frames, 6)} [{f.fingerprint[:12]}]"


def _chain(frames: tuple[Frame, ...], limit: int) -> str:
    """`f1 < f2 < ...`: function names, innermost first."""
    chain = " < ".join(fr.function or Path(fr.module).name or "??" for fr in frames[:limit])
    return (chain or "??") + (" < ..." if len(frames) > limit else "")


def _site_frames(f: Finding, probed: frozenset[str]) -> tuple[Frame, ...]:
    """Its stack without the probed function itself (an entry probe's frame #0; a
    return probe's stack starts at the caller already)."""
    return f.frames[1:] if len(f.frames) > 1 and f.frames[0].function in probed else f.frames


def growth_line(f: Finding, probed: frozenset[str]) -> str:
    """`map at map__new < ...: 1 -> 6 objects (+5), 3 -> 1 032 references (+1 029)`."""
    what = f.type_name if f.kind == "leak" else f"{f.kind} on {f.type_name}"
    return f"{what} at {_chain(_site_frames(f, probed), 3)}: {f.growth()}"


def message(f: Finding) -> str:
    where = "allocated at" if f.kind == "leak" else "at"
    grown = f", grown since the baseline ({f.growth()})" if f.grown else ""
    lines = [f"{title(f)}{grown}, in {len(set(f.pids))} process(es), {where}:"]
    lines += [f"  #{i} {frame.describe()}" for i, frame in enumerate(f.frames)]
    for g in f.groups[:1]:
        lines += [_culprit_line(c, len(g.objects)) for c in g.culprits[:3]]
    return "\n".join(lines)


def _culprit_line(c: Culprit, leaked: int) -> str:
    """Found against a baseline, a culprit's path is the call that changed: for a missing
    put the put that is gone, which was no get."""
    if c.baseline:
        what = "the put lost at" if c.kind == MISSING_PUT else "the extra get at"
        return (f"  culprit: {c.kind} in {named(c)}, {what} {short_path(c.frames, 8)} "
                f"(found against {c.baseline})")
    return (f"  culprit: {c.kind} in {named(c)}, got at {short_path(c.frames, 8)} "
            f"(unmatched in {c.objects} of {leaked} leaked objects; named by {c.evidence})")


def probed_functions(result: RunResult) -> frozenset[str]:
    """The refcount functions themselves: never the place to point a user at."""
    return frozenset(p.function for p in result.tracing.probes
                     if not p.function.startswith("usdt "))


def user_frame(f: Finding, root: Path, probed: frozenset[str] = frozenset()
               ) -> tuple[str, int] | None:
    """(path relative to root, line) of the first frame in the user's source tree:
    the culprit's line first (culpritlines.py), then its path outward, then the
    allocation stack, skipping the probed refcount functions."""
    top = f.groups[0].culprits[0] if f.groups and f.groups[0].culprits else None
    candidates = [*top.exits[:1], top.function, *top.frames[::-1]] if top is not None else []
    for frame in [*candidates, *f.frames]:
        rel = _relative(frame, root)
        if rel and frame.function not in probed:
            return rel, frame.line
    return None


def unlocated_warning(result: RunResult, verdict: Verdict, root: Path) -> str | None:
    """Findings with source files but none under `root` lose their SARIF/annotation
    locations: say so (a report re-rendered on another machine, a wrong --source-root)."""
    probed = probed_functions(result)
    lost = [f for f in verdict.findings if any(fr.file for fr in f.frames)
            and user_frame(f, root, probed) is None]
    if not lost:
        return None
    example = next(fr.file for fr in lost[0].frames if fr.file)
    return (f"refcntd: warning: {len(lost)} finding(s) have no source file under "
            f"--source-root {root.resolve()} (e.g. {visible(example)}): their SARIF results "
            "and annotations carry no location; give the tree they were built from")


def _relative(frame: Frame, root: Path) -> str | None:
    """A relative DWARF path (a unit built without its directory, glibc's
    `sysdeps/...`) is taken under `root` only when that file is there: resolved
    against the working directory it passed for a file of the user's tree."""
    if not frame.file or not frame.line:
        return None
    path = Path(frame.file)
    if not path.is_absolute() and not (root / path).is_file():
        return None
    try:
        return (root / path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


# ---- SARIF --------------------------------------------------------------------
def sarif(result: RunResult, verdict: Verdict, root: Path) -> dict[str, object]:
    rules = [{"id": LEAK_RULE, "name": "ReferenceLeak",
              "shortDescription": {"text": "An object was still referenced when its process "
                                           "exited"},
              "defaultConfiguration": {"level": "error"}}]
    rules += [{"id": kind, "name": kind.title().replace("-", ""),
               "shortDescription": {"text": text[:1].upper() + text[1:]},
               "defaultConfiguration": {"level": "error"}}
              for kind, text in ANOMALY_TEXT.items() if not kind.startswith("unknown")]
    run = {
        "tool": {"driver": {"name": "refcntd", "version": __version__,
                            "informationUri": INFO_URI, "rules": rules}},
        "originalUriBaseIds": {"SRCROOT": {"uri": root.resolve().as_uri() + "/"}},
        "invocations": [{"executionSuccessful": result.tracing.complete,
                         "toolExecutionNotifications": [
                             {"level": "warning", "message": {"text": f"{n} x {reason}"}}
                             for reason, n in result.tracing.lost.items()]}],
        "results": [_sarif_result(f, root, probed_functions(result), verdict.baseline)
                    for f in verdict.findings],
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def _sarif_result(f: Finding, root: Path, probed: frozenset[str], baseline: bool
                  ) -> dict[str, object]:
    out: dict[str, object] = {"ruleId": LEAK_RULE if f.kind == "leak" else f.kind, "level": "error",
                 "message": {"text": message(f)},
                 "partialFingerprints": {"refcntdFinding/v1": f.fingerprint},
                 "stacks": [{"message": {"text": "allocation stack" if f.kind == "leak"
                                         else "offending operation"},
                             "frames": [_sarif_frame(fr, root) for fr in f.frames]}]}
    located = user_frame(f, root, probed)
    if located:
        out["locations"] = [_physical(located[0], located[1])]
    related = _related(f, root)
    if related:
        out["relatedLocations"] = related
    if f.status != FAILING:
        out["suppressions"] = [{"kind": "external", "status": "accepted",
                                "justification": f.reason}]
    if baseline:
        out["baselineState"] = "new" if f.before is None else \
            "unchanged" if f.before == f.size else "updated"
    return out


def _related(f: Finding, root: Path) -> list[dict[str, object]]:
    """A missing put's culprit: where in its function released objects put such a
    reference, else its last call that touched the object (the put is missing
    after it), when that file is under `root`."""
    top = f.groups[0].culprits[0] if f.groups and f.groups[0].culprits else None
    if top is None:
        return []
    at, last = put_line(top), last_use_line(top)
    text = "released objects put such a reference here"
    if at is None and last is not None:
        at, text = last[0], (f"last use of the reference (call to {last[1]}): its put is "
                             "missing after this line")
    if at is None:
        return []
    rel = _relative(Frame("", 0, file=at[0], line=at[1]), root)
    return [{"id": 0, "message": {"text": text}, **_physical(rel, at[1])}] if rel else []


def _physical(uri: str, line: int) -> dict[str, object]:
    return {"physicalLocation": {"artifactLocation": {"uri": uri, "uriBaseId": "SRCROOT"},
                                 "region": {"startLine": line}}}


def _sarif_frame(frame: Frame, root: Path) -> dict[str, object]:
    location: dict[str, object] = {
        "logicalLocations": [{"fullyQualifiedName": frame.function or "??", "kind": "function"}]}
    rel = _relative(frame, root)
    if rel:
        location.update(_physical(rel, frame.line))
    return {"location": location, "module": frame.module or "??"}


# ---- JUnit --------------------------------------------------------------------
def junit(result: RunResult, verdict: Verdict) -> str:
    suite = ET.Element("testsuite", name="refcntd", tests=str(max(1, len(verdict.findings))),
                       failures=str(len(verdict.failing())),
                       skipped=str(len(verdict.findings) - len(verdict.failing())),
                       errors="0" if result.tracing.complete else "1")
    for f in verdict.findings:
        case = ET.SubElement(suite, "testcase", classname=f"refcntd.{f.kind}",
                             name=case_name(f))
        if f.status == FAILING:
            brief = title(f) + (f"; {f.reason}" if f.grown else "")
            ET.SubElement(case, "failure", message=brief, type=f.kind).text = message(f)
        else:
            ET.SubElement(case, "skipped", message=f.reason)
    if not verdict.findings:
        ET.SubElement(suite, "testcase", classname="refcntd", name="no refcount findings")
    if not result.tracing.complete:
        case = ET.SubElement(suite, "testcase", classname="refcntd", name="tracing complete")
        lost = "; ".join(f"{n} x {r}" for r, n in result.tracing.lost.items())
        failed = [p for p in result.tracing.probes if not p.installed]
        ET.SubElement(case, "error", message="tracing incomplete").text = \
            lost + "".join(f"; probe not installed: {p.function}" for p in failed)
    for node in suite.iter():  # XML 1.0 cannot carry most control characters at all
        node.text = visible(node.text, keep="\n\t") if node.text else node.text
        node.attrib = {k: visible(v) for k, v in node.attrib.items()}
    body = ET.tostring(_wrap(suite), encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n"


def _wrap(suite: ET.Element) -> ET.Element:
    root = ET.Element("testsuites", name="refcntd", tests=suite.get("tests", ""),
                      failures=suite.get("failures", ""))
    root.append(suite)
    return root


# ---- GitHub Actions ---------------------------------------------------------------
def _escape_data(text: str) -> str:
    return visible(text, keep="\r\n").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(result: RunResult, verdict: Verdict, root: Path) -> list[str]:
    """Workflow commands: `::error file=F,line=L,title=T::message` per failing finding."""
    out, probed = [], probed_functions(result)
    for f in verdict.findings:
        level = "error" if f.status == FAILING else "notice"
        props = [f"title={_escape_property('refcntd: ' + title(f))}"]
        located = user_frame(f, root, probed)
        if located:
            props = [f"file={_escape_property(located[0])}", f"line={located[1]}", *props]
        text = message(f) if f.status == FAILING else f"{title(f)}: {f.reason}"
        out.append(f"::{level} {','.join(props)}::{_escape_data(text)}")
    return out


def github_summary(result: RunResult, verdict: Verdict) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY."""
    failing = verdict.failing()
    head = "### refcntd: " + (f"{len(failing)} finding(s)" if failing else "no refcount findings")
    lines = [head, "", f"{len(result.processes)} process(es) traced; tracing "
             + ("complete" if result.tracing.complete else "**incomplete**"), ""]
    probed = probed_functions(result)
    if verdict.findings:
        lines += ["| status | finding | processes | where |", "|---|---|---|---|"]
        for f in verdict.findings:
            # the probed function itself is not "where"; a return probe's stack starts
            # at the caller already, which stays
            where = short_path(_site_frames(f, probed), 3).replace("|", "\\|")
            status = f"{f.status} (grew: {f.growth()})" if f.grown else f.status
            lines.append(f"| {status} | {title(f)} | {len(set(f.pids))} | `{where}` |")
    lines += [f"- unused suppression: `{r}` (line {r.line})" for r in verdict.unused_rules]
    return "\n".join(visible(line) for line in lines) + "\n"


def write_github(result: RunResult, verdict: Verdict, root: Path, stream: TextIO) -> None:
    for line in github_annotations(result, verdict, root):
        print(line, file=stream)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        append_summary(summary, github_summary(result, verdict))


def append_summary(path: str, text: str) -> None:
    """Append to the step summary.  A regular file is rewritten as a new file renamed into
    place (the traced command may have planted a link there, which must be neither
    followed nor read through); a FIFO or /dev/stdout is appended to in place."""
    try:
        with output_file(path, append=True) as f:
            f.write(text.encode())
    except OSError as err:
        raise UsageError(f"cannot write GITHUB_STEP_SUMMARY {path}: {err.strerror}") from None


def verdict_text(result: RunResult, verdict: Verdict) -> str:
    """Closing lines of the text output about suppressions, baseline and thresholds;
    a finding the baseline has that grew, with by how much."""
    probed = probed_functions(result)
    lines = [f"refcntd: grew since the baseline: {growth_line(f, probed)}{_blame(f)}"
             for f in verdict.grown()]
    lines += _passing_lines([f for f in verdict.findings if f.status != FAILING], probed)
    lines += [f"refcntd: unused suppression: {r} (line {r.line})" for r in verdict.unused_rules]
    lines.append(f"refcntd: {_tally(verdict)}")
    return "\n".join(visible(line) for line in lines) + "\n"


def _passing_lines(passing: list[Finding], probed: frozenset[str]) -> list[str]:
    """A line per finding that does not fail, naming its site; findings not judged for
    one reason (a killed process, objects made after the exit scan) folded into one."""
    lines, folded = [], dict[str, list[Finding]]()
    reachable = [f for f in passing if f.status == REACHABLE]
    if len(reachable) > FOLD_REACHABLE:  # each process's report lists their sites
        lines.append(f"refcntd: {REACHABLE} at exit: {sum(f.objects for f in reachable)} "
                     f"{_types(reachable)} object(s) at {len(reachable)} sites "
                     "(--fail-on reachable fails them)")
    for f in passing:
        if f.status == NOT_JUDGED and f.kind == "leak":
            folded.setdefault(f.reason, []).append(f)
        elif f.status == REACHABLE:
            if len(reachable) <= FOLD_REACHABLE:
                lines.append(f"refcntd: {REACHABLE} at exit: {f.objects} {f.type_name} "
                             f"object(s){_blame(f)} at {_chain(_site_frames(f, probed), 3)} "
                             "(--fail-on reachable fails them)")
        else:
            lines.append(f"refcntd: {f.status}: {title(f)} at "
                         f"{_chain(_site_frames(f, probed), 3)} ({f.reason})")
    for reason, group in folded.items():
        if len(group) == 1:
            lines.append(f"refcntd: {NOT_JUDGED}: {title(group[0])} at "
                         f"{_chain(_site_frames(group[0], probed), 3)} ({reason})")
            continue
        lines.append(f"refcntd: {NOT_JUDGED}: {sum(f.objects for f in group)} "
                     f"{_types(group)} object(s) at {len(group)} sites ({reason})")
    return lines


FOLD_REACHABLE = 3  # more still reachable findings than this: one line for them all


def _types(findings: list[Finding]) -> str:
    types = sorted({f.type_name for f in findings})
    return "/".join(types[:4]) + ("/..." if len(types) > 4 else "")


def _tally(verdict: Verdict) -> str:
    """`2 failing finding(s), 0 suppressed`, then the other outcomes the run's options
    and findings have: in baseline (--baseline), under thresholds (--max-leaks), still
    reachable, not judged (leak kinds)."""
    n = len(verdict.failing())
    grown = f" ({len(verdict.grown())} grown since the baseline)" if verdict.grown() else ""
    parts = [f"{n} failing finding(s){grown}", f"{verdict.count(SUPPRESSED)} suppressed"]
    given = {BASELINE: verdict.baseline, UNDER_THRESHOLD: verdict.thresholds}
    for status, label in ((BASELINE, "in baseline"), (UNDER_THRESHOLD, "under thresholds"),
                          (REACHABLE, REACHABLE), (NOT_JUDGED, NOT_JUDGED)):
        if given.get(status) or verdict.count(status):
            parts.append(f"{verdict.count(status)} {label}")
    return ", ".join(parts)
