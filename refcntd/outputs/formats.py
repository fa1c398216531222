"""Every format `refcntd report --format` renders a run to: one renderer per name.

A renderer takes the run, the policy's verdict and the source root (where SARIF
and GitHub annotations point) and returns the text.  Live runs write SARIF and
JUnit through the same renderers (cli/common.py: ci_outputs).  The backends are
imported when a format is rendered: the command line lists the names before
`attach` starts its BPF compile.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refcntd.analysis.model import RunResult
    from refcntd.outputs.policy import Verdict

Renderer = Callable[["RunResult", "Verdict", Path], "str | bytes"]  # bytes: pprof


def text(result: RunResult, verdict: Verdict, _root: Path) -> str:
    from refcntd.outputs import ciformats, report
    out = "".join(report.render_process(p) + "\n" for p in result.processes
                  if not report.quiet(p))
    return out + report.render_run(result) + ciformats.verdict_text(result, verdict)


def sarif(result: RunResult, verdict: Verdict, root: Path) -> str:
    """SARIF 2.1.0, as JSON text (the one place it is serialised)."""
    from refcntd.outputs import ciformats
    return json.dumps(ciformats.sarif(result, verdict, root), indent=2) + "\n"


def junit(result: RunResult, verdict: Verdict, _root: Path) -> str:
    from refcntd.outputs import ciformats
    return ciformats.junit(result, verdict)


def github(result: RunResult, verdict: Verdict, root: Path) -> str:
    """Workflow-command annotations, then the step summary."""
    from refcntd.outputs import ciformats
    return ("\n".join(ciformats.github_annotations(result, verdict, root)) + "\n"
            + ciformats.github_summary(result, verdict))


def folded(result: RunResult, _verdict: Verdict, _root: Path) -> str:
    """Stacks for flame graphs."""
    from refcntd.outputs.folded import folded as render
    return render(result)


def pprof(result: RunResult, _verdict: Verdict, _root: Path) -> bytes:
    """A gzip'd perftools.profiles.Profile of the leaked objects (docs/profiles.md)."""
    from refcntd.outputs.pprof import run_profile
    return run_profile([result])


def html(result: RunResult, _verdict: Verdict, _root: Path) -> str:
    """One self-contained page: flame graph, tables, culprits, anomalies."""
    from refcntd.outputs.html import render_html
    return render_html([result])


RENDERERS: dict[str, Renderer] = {"text": text, "sarif": sarif, "junit": junit,
                                  "github": github, "folded": folded, "pprof": pprof,
                                  "html": html}
LOCATED = frozenset({"sarif", "github"})  # formats whose findings point into the source tree
