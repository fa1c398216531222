"""The docs keep up with the code: every command, option, bundled spec and metric
is documented, every relative link resolves, and the README stays a front page.

Commands and options are read from the real parser (`refcntd.cli.main.build_parser`),
metric names from the real collectors, so a new one without docs fails here.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from contextlib import nullcontext
from functools import cache
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from refcntd.cli.main import build_parser
from refcntd.outputs.reportstore import StoreStats
from refcntd.service.gcpauses import GcPauses
from refcntd.service.metrics import BuildInfo, RefcntdCollector

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@cache
def docs_text() -> str:
    return "\n".join(p.read_text() for p in markdown_files())


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command of the parser, nested ones (`spec draft`) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


def is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def options(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for action in parser._actions if not isinstance(action, argparse._HelpAction)
            for opt in action.option_strings]


def mentions_option(text: str, option: str) -> bool:
    """`--history` as a word of its own, not the start of `--history-depth`."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def command_page(path: tuple[str, ...]) -> Path | None:
    """docs/commands/NAME.md; a page may serve several commands (checkpoint-diff.md)."""
    for page in sorted((DOCS / "commands").glob("*.md")):
        if page.stem == "-".join(path) or (len(path) == 1 and path[0] in page.stem.split("-")):
            return page
    return None


ALL_COMMANDS = list(commands(build_parser()))
LEAF_COMMANDS = [(path, p) for path, p in ALL_COMMANDS if is_leaf(p)]


def test_the_parser_walk_finds_the_commands():  # an empty walk would pass every test below
    assert {("run",), ("spec", "draft")} <= {path for path, _ in LEAF_COMMANDS}


@pytest.mark.parametrize("path", [path for path, _ in ALL_COMMANDS], ids=" ".join)
def test_every_command_is_documented(path):
    assert re.search(rf"refcntd\s+{re.escape(' '.join(path))}\b", docs_text()), \
        f"`refcntd {' '.join(path)}` appears nowhere in README.md or docs/"


@pytest.mark.parametrize(("path", "parser"), LEAF_COMMANDS, ids=[" ".join(p) for p, _ in
                                                                  LEAF_COMMANDS])
def test_every_option_is_documented(path, parser):
    missing = [o for o in options(parser) if not mentions_option(docs_text(), o)]
    assert not missing, f"refcntd {' '.join(path)}: {missing} not in README.md or docs/"


@pytest.mark.parametrize(("path", "parser"), LEAF_COMMANDS, ids=[" ".join(p) for p, _ in
                                                                  LEAF_COMMANDS])
def test_every_command_page_lists_its_options(path, parser):
    page = command_page(path)
    assert page is not None, f"no page docs/commands/{'-'.join(path)}.md"
    missing = [o for o in options(parser) if not mentions_option(page.read_text(), o)]
    assert not missing, f"{page.relative_to(ROOT)}: {missing} not listed"


@pytest.mark.parametrize("spec", sorted(p.stem for p in (ROOT / "configs/specs").glob("*.yaml")))
def test_every_bundled_spec_is_documented(spec):
    text = (DOCS / "specs.md").read_text()
    assert f"`{spec}`" in text or f"{spec}.yaml" in text, f"{spec} not in docs/specs.md"


def exported_metrics() -> set[str]:
    """The names a scrape shows (counters with `_total`), from the real collectors
    with no target: every family is described even when it has no sample."""
    registry = CollectorRegistry()
    registry.register(RefcntdCollector(lambda: nullcontext([]), StoreStats))
    registry.register(BuildInfo("0", "0"))
    registry.register(GcPauses())
    text = generate_latest(registry).decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def test_the_metrics_are_enumerated():
    assert {"refcntd_live_objects", "refcntd_operations_total"} <= exported_metrics()


def mentions_metric(text: str, metric: str) -> bool:
    return re.search(rf"`{re.escape(metric)}(?![\w])", text) is not None


@pytest.mark.parametrize("metric", sorted(exported_metrics()))
def test_every_metric_is_documented(metric):
    assert mentions_metric((DOCS / "service.md").read_text(), metric), \
        f"{metric} is exported but not documented in docs/service.md"


def test_every_documented_metric_exists():
    rows = [line for line in (DOCS / "service.md").read_text().splitlines()
            if line.startswith("| `refcntd_")]
    documented = {name for row in rows for name in re.findall(r"`(refcntd_\w+)", row.split("|")[1])}
    assert documented, "no metric table in docs/service.md"
    assert documented <= exported_metrics(), documented - exported_metrics()


def links(path: Path) -> Iterator[str]:
    """Relative link targets of a markdown file, outside code blocks."""
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", path.read_text())):
        if not re.match(r"[a-z]+:", target):
            yield target


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes,
    a repeated heading numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_the_readme_is_a_front_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_no_page_denies_the_leak_kinds():
    """refcntd tells definitely lost from still reachable (issue 54, item 6: specs.md
    said it did not, after leak kinds became the default)."""
    text = " ".join(docs_text().split())
    assert "no reachable/definite distinction" not in text
    assert "leaked when its count is not zero" not in text
