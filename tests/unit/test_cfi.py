"""CFI compilation (no BPF): rows from readelf's evaluated tables, and Debian's libc."""

from __future__ import annotations

import subprocess

from refcntd.kernel.cfi import ROW, CfaRule, _merge, _parse_readelf, load_table

READELF = """\
Contents of the .eh_frame section (loaded from x):

00000000 0000000000000014 00000000 CIE "zR" cf=1 df=-8 ra=16
   LOC           CFA      ra
0000000000000000 rsp+8    c-8

00000018 0000000000000024 0000001c FDE cie=00000000 pc=0000000000001020..0000000000001040
   LOC           CFA      ra
0000000000001020 rsp+16   c-8
0000000000001026 rsp+24   c-8
0000000000001030 exp      c-8

00000040 0000000000000014 00000044 FDE cie=00000000 pc=0000000000001100..0000000000001110

00000058 0000000000000030 0000005c FDE cie=00000000 pc=0000000000001200..0000000000001260
   LOC           CFA      rbp   ra
0000000000001200 rsp+8    u     c-8
0000000000001201 rsp+16   c-16  c-8
0000000000001204 rbp+16   c-16  c-8
000000000000125f rsp+8    c-16  c-8

00000090 0000000000000014 00000094 FDE cie=00000000 pc=0000000000001300..000000000000130a
   LOC           CFA      ra
0000000000001300 rsp+8    u
"""


def test_rows_from_readelf():
    fdes = _merge(_parse_readelf(READELF.splitlines(), [(0x1020, 0x1040)]))
    assert [(f.start, f.end) for f in fdes] == [(0x1020, 0x1040), (0x1100, 0x1110),
                                                (0x1200, 0x1260), (0x1300, 0x130A)]
    plt, bare, framed, start = (f.rows for f in fdes)
    assert plt[2] == (0x1030, CfaRule.PLT, 0, 0)  # the PLT expression, inside .plt
    assert bare == [(0x1100, CfaRule.RSP, 8, 0)]  # no rows: the CIE's initial rule
    assert framed[2] == (0x1204, CfaRule.RBP, 16, -16)
    assert start == [(0x1300, CfaRule.END, 0, 0)]  # return address undefined: _start


def test_expression_outside_plt_is_not_followed():
    (fde, *_) = _parse_readelf(READELF.splitlines(), [])
    assert fde.rows[2][1] == CfaRule.BAD


def test_libc_table_is_sorted_and_cached(tmp_path):
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    table = load_table(libc, cache_dir=tmp_path)
    assert table.count > 10000 and table.build_seconds > 0 and not table.has_frame_pointers
    rows = [ROW.unpack_from(table.rows, i * ROW.size) for i in range(table.count)]
    pcs = [r[0] for r in rows]
    assert pcs == sorted(pcs) and len(set(pcs)) == len(pcs)
    assert {CfaRule.RSP, CfaRule.NONE, CfaRule.PLT} <= {r[3] for r in rows}
    again = load_table(libc, cache_dir=tmp_path)
    assert again.rows == table.rows and again.build_seconds == 0  # from the cache
    notes = subprocess.run(["readelf", "-n", libc], capture_output=True, text=True).stdout
    assert table.build_id.hex() in notes


def test_the_zero_terminator_is_not_a_row():
    """readelf ends .eh_frame with "000000b4 ZERO terminator", which once parsed as a row
    of the last FDE (gcc puts main's there) at pc 0xb4: when main ends where _start
    begins, _start's end row was then dropped as a repeat of that bogus row, and every
    stack read one more return address past _start ("outside every mapping")."""
    text = READELF + "\n000000b4 ZERO terminator\n\n"
    for fde in _parse_readelf(text.splitlines(), []):
        assert all(fde.start <= row[0] < fde.end for row in fde.rows), (fde.start, fde.rows)
