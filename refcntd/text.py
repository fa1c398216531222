"""Text that reaches a terminal, an XML file or a CI log from untrusted sources."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def visible(text: str, keep: str = "") -> str:
    """Control characters escaped as \\xNN (those in `keep` left alone).  Type and function
    names are whatever bytes the traced program holds, paths whatever the user typed:
    they must not drive the terminal, break XML, split a one-line error or forge CI
    annotations."""
    return _CONTROL.sub(lambda m: m.group() if m.group() in keep else f"\\x{ord(m.group()):02x}",
                        text)
