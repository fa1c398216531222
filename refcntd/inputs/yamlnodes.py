"""Strict YAML reading that keeps line numbers for every error.

PyYAML's composed node tree is kept (rather than plain dicts) so that a wrong
type or an unknown key can be reported as `file:line: key.path: problem`.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from pathlib import Path

import yaml

from refcntd.errors import ConfigError
from refcntd.inputs.files import read_text


class YNode:
    """A YAML node plus the file and dotted key path that lead to it."""

    def __init__(self, node: yaml.Node, path: str, key: str, key_line: int = 0) -> None:
        self.node, self.path, self.key = node, path, key
        self.key_line = key_line  # line of the `key:` that introduced this node

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def fail(self, problem: str) -> ConfigError:
        return ConfigError(self.path, self.line, self.key or "(top level)", problem)

    def is_mapping(self) -> bool:
        return isinstance(self.node, yaml.MappingNode)

    def is_null(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode) and self.node.tag.endswith(":null")

    def mapping(self, allowed: set[str], required: Set[str] = frozenset()) -> dict[str, YNode]:
        """The children of a mapping; unknown or missing keys are errors."""
        if not self.is_mapping():
            raise self.fail(f"expected a mapping with keys {sorted(allowed)}")
        out: dict[str, YNode] = {}
        for knode, vnode in self.node.value:
            name = knode.value if isinstance(knode, yaml.ScalarNode) else None
            child_key = f"{self.key}.{name}" if self.key else str(name)
            if not isinstance(name, str) or name not in allowed:
                raise YNode(knode, self.path, child_key).fail(
                    f"unknown key (allowed: {', '.join(sorted(allowed))})")
            if name in out:
                raise YNode(knode, self.path, child_key).fail("duplicate key")
            out[name] = YNode(vnode, self.path, child_key, knode.start_mark.line + 1)
        for name in sorted(required - out.keys()):
            line = self.key_line or self.line
            raise ConfigError(self.path, line, self.key or "(top level)",
                              f"missing required key '{name}'")
        return out

    def pairs(self) -> Iterator[tuple[str, YNode]]:
        """The (key, value) children of a mapping whose keys are data (user names)."""
        if not self.is_mapping():
            raise self.fail("expected a mapping")
        for knode, vnode in self.node.value:
            name = str(knode.value)
            yield name, YNode(vnode, self.path, f"{self.key}.{name}", knode.start_mark.line + 1)

    def items(self) -> Iterator[YNode]:
        """The elements of a sequence (a single scalar counts as one element)."""
        if isinstance(self.node, yaml.SequenceNode):
            for i, child in enumerate(self.node.value):
                yield YNode(child, self.path, f"{self.key}[{i}]")
        elif isinstance(self.node, yaml.ScalarNode) and not self.is_null():
            yield self
        else:
            raise self.fail("expected a list")

    def scalar(self) -> object:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.fail("expected a single value")
        return yaml.safe_load(yaml.serialize(self.node))

    def string(self) -> str:
        value = self.scalar()
        if not isinstance(value, str) or not value:
            raise self.fail("expected a non-empty string")
        return value

    def integer(self, low: int, high: int) -> int:
        value = self.scalar()
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"expected an integer in [{low}, {high}]")
        if not low <= value <= high:
            raise self.fail(f"{value} is out of range [{low}, {high}]")
        return value

    def boolean(self) -> bool:
        value = self.scalar()
        if not isinstance(value, bool):
            raise self.fail("expected true or false")
        return value


def load_yaml(path: Path, what: str = "YAML file") -> YNode:
    """Parse a YAML file into a YNode; syntax errors become ConfigError."""
    text = read_text(path, what)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else 0
        raise ConfigError(str(path), line, "(syntax)", str(err.problem or err)) from None
    except yaml.YAMLError as err:
        raise ConfigError(str(path), 0, "(syntax)", str(err)) from None
    if node is None:
        raise ConfigError(str(path), 1, "(top level)", "the file is empty")
    return YNode(node, str(path), "")
