"""A run (or serve's live objects) as one self-contained HTML page.

An icicle graph of the objects by allocation stack (searchable, zoom by click;
drawn by `flame.js`, ours, inlined), a table per type, each leak group with its
culprit verdict and evidence, each object's history when it was recorded, and
the anomalies with both stacks.  The page fetches nothing: its Content Security
Policy allows no source at all but its own inline script and style (by hash),
so it opens offline and an injected tag could load nothing.  Every name from the
traced program (type, function, file) is escaped for HTML after its control
characters are made visible, as in the text report.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import shlex
from collections.abc import Iterator, Sequence
from importlib import resources

from refcntd import __version__
from refcntd.analysis.model import (
    STATE_LIVE_AT_DETACH,
    AnomalyFinding,
    LeakedObject,
    LeakGroup,
    ProcessReport,
    RunResult,
    StackUnwind,
)
from refcntd.outputs.ciformats import probed_functions
from refcntd.outputs.pprof import alloc_frames, group_values
from refcntd.outputs.report import render_culprits, render_holders, render_tracing, short_path
from refcntd.symbolize.symbolizer import Frame
from refcntd.text import visible

MAX_OBJECTS = 50  # listed per group; the rest are counted
Values = tuple[int, int, int]  # objects, references, sum of ages in ns

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.6em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;
text-align:left}td.n{text-align:right}code,pre,.stack{font:12px/1.35 monospace}
.stack{margin:.2em 0 .6em 1.2em;padding:0}.stack li{list-style:none;white-space:pre-wrap}
#flame{position:relative;width:100%;overflow:hidden;border:1px solid #ddd;margin:.5em 0}
.fr{position:absolute;height:17px;box-sizing:border-box;border:1px solid #fff;
font:11px/15px monospace;padding:0 3px;overflow:hidden;white-space:nowrap;
text-overflow:ellipsis;cursor:pointer}
.fr.ty{background:#9cc3f0}.fr.up{opacity:.55}.fr.hit{background:#e36bd6!important}
.verdict{background:#f6f6f0;border-left:3px solid #b80;padding:.3em .8em;white-space:pre-wrap}
.anomalies td{vertical-align:top}#js-errors{color:#b00}.muted{color:#777}
details{margin:.4em 0}summary{cursor:pointer}
""".strip()


def render_html(results: Sequence[RunResult], live: bool = False) -> str:
    """The page for a saved or finished run, or (`live`) for serve's or attach's live
    objects now, one RunResult per target."""
    values = {id(g): group_values(g) for r in results for p in r.processes for g in p.groups}
    script = resources.files(__package__).joinpath("flame.js").read_text()
    word = "live" if live else "leaked"
    title = f"refcntd: {word} objects" + (f" of {results[0].target}" if len(results) == 1
                                          else "")
    body = "\n".join([
        f"<h1>{_e(title)}</h1>", *_summary(results, live),
        "<pre id=\"js-errors\" hidden></pre>",
        f"<h2>Objects by allocation stack</h2>{_FLAME_CONTROLS}",
        f"<script id=\"flame-data\" type=\"application/json\">"
        f"{_json(_tree(results, values))}</script>",
        *_types_table(results, values, word),
        *(part for r in results for p in r.processes for part in _process(r, p, values, live)),
        f"<p class=\"muted\">refcntd {_e(__version__)}</p>"])
    csp = (f"default-src 'none'; script-src '{_sha256(script)}'; "
           f"style-src '{_sha256(CSS)}'; base-uri 'none'; form-action 'none'")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n"
            f"<meta name=\"viewport\" content=\"width=device-width\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}</style></head>\n<body>\n{body}\n"
            f"<script>{script}</script>\n</body></html>\n")


_FLAME_CONTROLS = """
<p><label>Weigh by <select id="flame-metric"><option value="1">objects</option>
<option value="2">references</option></select></label>
<label>Search <input id="flame-search" type="search" placeholder="function or [type]"></label>
<button id="flame-reset" type="button">Reset zoom</button></p>
<p id="flame-status" class="muted"></p><div id="flame"></div>"""


def _e(text: str, keep: str = "") -> str:
    """Untrusted text for HTML: control characters (but `keep`) and lone surrogates made
    visible, then escaped."""
    return html.escape(visible(text, keep).encode("utf-8", "backslashreplace").decode())


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _json(data: object) -> str:
    """JSON inside <script>: no '<', '>' or '&' can close the element or open a comment."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def frame_name(f: Frame) -> str:
    """A frame as the flame graph names it (the folded format's names)."""
    return f.function or (f"{f.module.rsplit('/', 1)[-1]}+0x{f.vaddr:x}" if f.module
                          else f"?? {f.raw}")


def _tree(results: Sequence[RunResult], values: dict[int, Values]) -> dict[str, object]:
    """{"names": [...], "root": [name index, objects, references, [children]]}: the
    target (when several), the process, the stack outermost first (without the probed
    function, as in the pprof profile), then [type]."""
    names: dict[str, int] = {}
    root = _Node(_name(names, "all"))
    for r in results:
        probed = probed_functions(r)
        for p in r.processes:
            for g in p.groups:
                path = [*([r.target] if len(results) > 1 else []),
                        f"{p.comm or '?'} ({p.pid})",
                        *(frame_name(f) for f in reversed(alloc_frames(g.frames, probed))),
                        f"[{g.shown_type}]"]
                root.add([_name(names, n) for n in path], values[id(g)])
    return {"names": list(names), "root": root.as_list()}


def _name(names: dict[str, int], text: str) -> int:
    clean = visible(text).encode("utf-8", "backslashreplace").decode()
    return names.setdefault(clean, len(names))


class _Node:
    def __init__(self, name: int) -> None:
        self.name, self.objects, self.references = name, 0, 0
        self.kids: dict[int, _Node] = {}

    def add(self, path: list[int], v: Values) -> None:
        node = self
        for name in [-1, *path]:
            node = node if name < 0 else node.kids.setdefault(name, _Node(name))
            node.objects += v[0]
            node.references += v[1]

    def as_list(self) -> list[object]:
        kids = sorted(self.kids.values(), key=lambda k: -k.objects)
        return [self.name, self.objects, self.references, [k.as_list() for k in kids]]


def _summary(results: Sequence[RunResult], live: bool) -> Iterator[str]:
    for r in results:
        at_detach = sum(p.leaked_objects for p in r.processes if p.state == STATE_LIVE_AT_DETACH)
        counted = f"{sum(p.leaked_objects for p in r.processes)} live objects" if live else \
            f"{r.leaked_objects} objects leaked" + (
                f", {at_detach} live at detach (not leaks)" if at_detach else "")
        status = f", command exit status {r.command_status}" \
            if r.command_status is not None else ""
        head = "target" if live else f"<b>{_e(r.mode)}</b> of"
        yield (f"<p>{head} <code>{_e(r.target)}</code>, spec "
               f"<code>{_e(r.spec)}</code>: {len(r.processes)} process(es), {counted}, "
               f"{r.anomalies} anomalies{status}</p>")
        if not live:
            yield f"<pre>{_e(render_tracing(r.tracing), keep=chr(10))}</pre>"


def _types_table(results: Sequence[RunResult], values: dict[int, Values],
                 word: str) -> Iterator[str]:
    rows: dict[str, list[int]] = {}  # type -> objects, references, sum of ages ns, sites
    pids: dict[str, set[int]] = {}
    for r in results:
        for p in r.processes:
            for g in p.groups:
                row = rows.setdefault(g.type_name, [0, 0, 0, 0])
                for i, v in enumerate(values[id(g)]):
                    row[i] += v
                row[3] += 1
                pids.setdefault(g.type_name, set()).add(p.pid)
    yield "<h2>Types</h2>"
    if not rows:
        yield f"<p>No {word} objects.</p>"
        return
    yield (f"<table id=\"types\"><tr><th>type</th><th>{word} objects</th><th>references</th>"
           "<th>mean age</th><th>allocation sites</th><th>processes</th></tr>")
    for name, (objects, refs, age_ns, sites) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        yield (f"<tr><td><code>{_e(name)}</code></td><td class=\"n\">{objects}</td>"
               f"<td class=\"n\">{refs}</td><td class=\"n\">{_age(age_ns // objects)}"
               f"</td><td class=\"n\">{sites}</td><td class=\"n\">{len(pids[name])}</td></tr>")
    yield "</table>"


def _age(ns: int) -> str:
    """0.08 ms, 12.3 ms, 4.5 s: two significant digits below a tenth of a millisecond."""
    if ns >= 10**9:
        return f"{ns / 1e9:.1f} s"
    return f"{ns / 1e6:.1f} ms" if ns >= 10**5 or not ns else f"{ns / 1e6:.2g} ms"


def _process(r: RunResult, p: ProcessReport, values: dict[int, Values],
             live: bool) -> Iterator[str]:
    status = f", {p.status_text}" if p.status_text else ""
    word = "live" if live or p.state == STATE_LIVE_AT_DETACH else "leaked"
    yield (f"<h2 id=\"pid-{p.pid}\">Process {p.pid} ({_e(p.comm)}): "
           f"{_e('live' if live else p.state)}{_e(status)}</h2>")
    if p.command:
        yield f"<p><code>{_e(shlex.join(p.command))}</code></p>"
    if p.anomalies:
        yield from _anomalies(p.anomalies)
    for i, g in enumerate(p.groups):
        top = alloc_frames(g.frames, probed_functions(r))
        yield from _group(g, values[id(g)], word, top[0].function if top else "", i < 8)
    for reason, n in p.kept.items():
        yield f"<p class=\"muted\">kept by the library on purpose: {n} object(s): {_e(reason)}</p>"
    if not p.groups and not p.anomalies:
        yield f"<p>No {word} objects.</p>"


def _stack(frames: Sequence[Frame], unwind: StackUnwind | None = None) -> str:
    items = "".join(f"<li>#{i} {_e(f.describe())}</li>" for i, f in enumerate(frames))
    cut = f"<li class=\"muted\">(stack {_e(unwind.describe())})</li>" \
        if unwind is not None and unwind.truncated_at is not None else ""
    return f"<ol class=\"stack\">{items or '<li>(no stack)</li>'}{cut}</ol>"


def _group(g: LeakGroup, v: Values, word: str, where: str, opened: bool) -> Iterator[str]:
    kind = "Indirectly leaked" if g.verdict and g.verdict.status == "indirect" else \
        word.capitalize()
    kind = f"{kind} ({g.kind})" if g.kind else kind  # --leak-kinds
    yield (f"<details class=\"group\"{' open' if opened else ''}><summary><b>{kind} {v[0]} "
           f"object(s) of type <code>{_e(g.type_name)}</code>"
           + (f" class <code>{_e(g.class_name)}</code>" if g.class_name else "")
           + f"</b>, {v[1]} reference(s)"
           f"{' at ' + _e(where) if where else ''}</summary>")
    yield "<p>Allocated at:</p>" + _stack(g.frames, g.unwind)
    verdict = render_culprits(g, word)
    if verdict:
        head = [f"verdict: {g.verdict.status}"] if g.verdict else []
        text = "\n".join([*head, *(line.strip() for line in verdict)])
        yield f"<div class=\"verdict\">{_e(text, keep=chr(10))}</div>"
    yield from _objects(g.objects[:MAX_OBJECTS], len(g.objects))
    yield "</details>"


def _objects(shown: Sequence[LeakedObject], total: int) -> Iterator[str]:
    yield ("<table class=\"objects\"><tr><th>object</th><th>count</th><th>gets</th>"
           "<th>puts</th><th>age</th><th>leak</th><th>held by</th><th>holders at the scan</th>"
           "</tr>")
    for o in shown:
        held = ", ".join(f"{h.type_name or '?'} 0x{h.address:x} ({h.references})"
                         for h in o.held_by)
        yield (f"<tr><td><code>0x{o.address:x}</code></td><td class=\"n\">{o.count}</td>"
               f"<td class=\"n\">{o.gets}</td><td class=\"n\">{o.puts}</td>"
               f"<td class=\"n\">{_age(o.age_ns)}</td>"
               f"<td>{_e(' '.join(filter(None, (o.kind, o.leak))))}"
               f"{_e(', from ' + o.root) if o.root else ''}</td>"
               f"<td>{_e(held)}</td>"
               f"<td>{'<br>'.join(_e(t.strip()) for t in render_holders(o))}</td></tr>")
    yield "</table>"
    if total > len(shown):
        yield f"<p class=\"muted\">... and {total - len(shown)} more objects</p>"
    for o in shown:
        if o.history_total:
            yield from _history(o)


def _history(o: LeakedObject) -> Iterator[str]:
    dropped = o.history_total - len(o.history)
    note = f", {dropped} later ones dropped" if dropped else ""
    yield (f"<details class=\"history\"><summary>history of 0x{o.address:x}: "
           f"{len(o.history)} of {o.history_total} operation(s){note}</summary>"
           "<table><tr><th>at</th><th>operation</th><th>count after</th><th>where</th></tr>")
    for step in o.history:
        cut = f" (stack {step.unwind.describe()})" if step.unwind.truncated_at is not None \
            else ""
        yield (f"<tr><td class=\"n\">+{_age(step.at_ns)}</td><td>{_e(step.op)}</td>"
               f"<td class=\"n\">{step.count_after}</td>"
               f"<td><code>{_e(short_path(step.frames, 8) + cut)}</code></td></tr>")
    yield "</table></details>"


def _anomalies(found: Sequence[AnomalyFinding]) -> Iterator[str]:
    yield ("<h3>Anomalies</h3><table class=\"anomalies\"><tr><th>finding</th><th>at</th>"
           "<th>allocated at</th></tr>")
    for a in found:
        label = "note" if a.separate else "ANOMALY"
        alloc = _stack(a.alloc_frames, a.alloc_unwind) if a.alloc_frames else \
            "never seen initialised"
        yield (f"<tr><td><b>{label} {_e(a.kind)}</b>: {_e(a.description)}<br>object "
               f"<code>0x{a.address:x}</code> of type <code>{_e(a.type_name)}</code>, count "
               f"{a.count_before} before, {a.occurrences} time(s)</td>"
               f"<td>{_stack(a.frames, a.unwind)}</td>"
               f"<td>{alloc}</td></tr>")
    yield "</table>"
