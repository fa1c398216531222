"""Fontconfig's FcParseInclude with a reference added (batch 5, issue 41), on
hand-written paths: the two ways a run alone named a function that had not
taken the extra reference.

FcParseInclude makes a new rule set (an initial reference that the parse's
cleanup puts) and takes a reference on the rule set it flushes (put when the
configuration is destroyed).  Both are made at one function path; only the
initial references are evidence for initial references.  And FcParseInclude is
inlined into FcEndElement: its two calls of FcRuleSetReference share
FcEndElement's frame address, so they are one call of FcParseInclude."""

from __future__ import annotations

from refcntd.analysis.attribution import Baseline, verdict
from refcntd.analysis.pathops import PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

LIB = "/usr/lib/libfontconfig.so.1"
OUTER = [Frame(LIB, 0x900, "XML_ParseBuffer", line=0),
         Frame(LIB, 0xa00, "FcConfigParseAndLoadFromMemoryInternal", line=3544),
         Frame(LIB, 0xb00, "main", line=20)]


def include(call: int, line: int) -> tuple[Frame, ...]:
    """FcParseInclude's frame at one of its calls, inlined into FcEndElement (one
    address, FcEndElement's line is where it inlines FcParseInclude)."""
    return (Frame(LIB, call, "FcParseInclude", line=line, raw="inlined"),
            Frame(LIB, call, "FcEndElement", line=3156), *OUTER)


def op(kind: Role, frames: tuple[Frame, ...], t: int) -> PathOp:
    return PathOp(kind, frames, 1, first_ns=t, last_ns=t)


CLEANUP = (Frame(LIB, 0x200, "FcConfigCleanup", line=1265),
           Frame(LIB, 0xa10, "FcConfigParseAndLoadFromMemoryInternal", line=3574),
           OUTER[2])
TEARDOWN = (Frame(LIB, 0x300, "FcPtrListDestroy", line=64),
            Frame(LIB, 0x310, "FcConfigDestroy", line=381), Frame(LIB, 0xb10, "main", 0))
# released: rule sets FcParseInclude made, each put by the parse's cleanup
RELEASED = [op(Role.INIT, include(0x100, 2591), 1), op(Role.PUT, CLEANUP, 2)]


def leaked() -> tuple[PathOp, list[PathOp]]:
    """The flushed rule set: made by the parse's init, referenced twice at
    FcParseInclude:2601 (two calls, the mutant), put once there and by the
    configuration's teardown; one of the two gets is left over."""
    init = op(Role.INIT, (Frame(LIB, 0x50, "FcConfigParseInit", line=1255), *OUTER[1:]), 0)
    first, second = op(Role.GET, include(0x120, 2601), 3), op(Role.GET, include(0x128, 2601), 4)
    return second, [init, first, second, op(Role.PUT, include(0x130, 2605), 5),
                    op(Role.PUT, TEARDOWN, 6)]


def test_an_initial_reference_is_no_evidence_for_a_get_at_its_path() -> None:
    get, ops = leaked()
    found = verdict(get, ops, Baseline.of(RELEASED))
    assert not (isinstance(found, list) and found[0].function.function ==
                "FcConfigParseAndLoadFromMemoryInternal"), found


def test_two_calls_in_one_inlined_call_are_not_decided() -> None:
    get, ops = leaked()
    found = verdict(get, ops, Baseline.of(RELEASED))
    assert isinstance(found, str), found
    assert "FcParseInclude took two references in one call" in found
