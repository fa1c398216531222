"""The kernel ABI is written once (bpf/refcntd.h); Python's mirror must never drift."""

from __future__ import annotations

import ctypes as C

from refcntd.kernel import abi, abigen
from refcntd.kernel.bcccompile import layout_difference
from refcntd.session.status import LOST_REASONS, NOTE_REASONS
from refcntd.session.tracer import type_id


def test_committed_abi_is_what_the_header_generates():
    assert abi.__file__ and open(abi.__file__).read() == abigen.generate(), \
        "bpf/refcntd.h changed: run `python -m refcntd.kernel.abigen`"


def test_every_counter_has_an_explanation_and_a_class():
    for stat in abi.Stat:
        assert (stat in LOST_REASONS) != (stat in NOTE_REASONS), stat
        assert abi.STAT_TEXT[stat].split(": ", 1)[1].strip(), stat


def test_the_two_history_counters_are_losses():
    assert abi.Stat.HISTORY_MAP_FULL in LOST_REASONS
    assert abi.Stat.SITES_MAP_FULL in LOST_REASONS


def test_parser_reads_fields_offsets_and_tunable_arrays():
    h = abigen.parse("#ifndef DEPTH\n#define DEPTH 4\n#endif\n#define N 3\n"
                     "struct a { __u32 x; __u64 y[N]; };\n"
                     "struct b { struct a inner; __s32 z[DEPTH]; char c; };\n"
                     "enum refcntd_stat { ST_A = 0, /* loss: a */\n"
                     " ST_B, /* note: b */\n ST_COUNT };")
    ns: dict[str, object] = {}
    exec(abigen.render(h), ns)  # noqa: S102 - the generator's own output
    a, b = ns["A"], ns["b_type"](depth=8)  # type: ignore[operator]
    assert C.sizeof(a) == 32 and a.y.offset == 8  # type: ignore[attr-defined]
    assert C.sizeof(b) == 32 + 32 + 8 and b.z.offset == 32  # type: ignore[attr-defined]
    assert ns["STAT_TEXT"] == {ns["Stat"].A: "loss: a", ns["Stat"].B: "note: b"}  # type: ignore[attr-defined]


def test_layout_difference_names_the_drifted_field():
    class Mine(C.Structure):
        _fields_ = [("a", C.c_uint32), ("b", C.c_uint32)]

    class Swapped(C.Structure):
        _fields_ = [("b", C.c_uint32), ("a", C.c_uint32)]

    class Wider(C.Structure):
        _fields_ = [("a", C.c_uint64), ("b", C.c_uint32)]

    assert layout_difference(Mine, Mine) == ""
    assert "fields" in layout_difference(Mine, Swapped)
    assert layout_difference(Mine, Wider).startswith("a: 4 vs 8")


def test_type_ids_match_the_kernel_hash():
    # FNV-1a of "map", low bit set: the value bpf/types.h:type_intern computes
    h = abi.FNV_OFFSET
    for byte in b"map":
        h = ((h ^ byte) * abi.FNV_PRIME) & 0xFFFFFFFF
    assert type_id("map") == h | 1
