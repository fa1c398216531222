"""One walk of the object map for every exited process waiting (kernel/drainahead.py):
each process gets exactly its own rows, and a process waiting alone keeps the plain walk."""

from __future__ import annotations

import random

from refcntd.kernel import abi
from refcntd.kernel import columns as objcols
from refcntd.kernel.drainahead import Ahead, rows_by_process


def _batch(rows: list[tuple[int, int]]):
    keys, values = (abi.ObjKey * len(rows))(), (abi.ObjVal * len(rows))()
    for i, (tgid, gen) in enumerate(rows):
        keys[i].tgid, keys[i].addr, values[i].gen = tgid, 0x1000 + 16 * i, gen
    n = len(rows)
    return (objcols.column(keys, abi.ObjKey, "tgid", n),
            objcols.column(values, abi.ObjVal, "gen", n))


def test_each_wanted_process_gets_exactly_its_rows():
    rng = random.Random(43)
    # pid reuse: tgid 5 also under another generation, and gens above 2**31
    pairs = [(5, 1), (5, 2), (6, 1), (7, 0xFFFFFFF0), (8, 3)]
    rows = [rng.choice(pairs) for _ in range(2000)]
    wanted = {(5, 2), (7, 0xFFFFFFF0), (9, 9)}
    found = rows_by_process(*_batch(rows), wanted)
    for pair in wanted:
        assert found.get(pair, []) == [i for i, r in enumerate(rows) if r == pair]
    assert set(found) <= wanted


def test_a_process_waiting_alone_is_walked_alone_and_others_are_kept_once():
    ahead = Ahead[str]()
    ahead.expect((1, 1))
    assert ahead.batch((1, 1)) == set()  # alone: the plain walk of one process
    assert ahead.batch((1, 1)) == set()  # and no longer waiting
    for pair in [(2, 1), (3, 1), (4, 1)]:
        ahead.expect(pair)
    assert ahead.batch((9, 9)) == set()  # never announced
    assert ahead.batch((3, 1)) == {(2, 1), (3, 1), (4, 1)}
    ahead.keep({(2, 1): "two", (4, 1): "four"})
    assert ahead.batch((2, 1)) == set()  # read by that walk: not waiting any more
    assert ahead.take((2, 1)) == "two"
    assert ahead.take((2, 1)) is None  # taken once
    assert ahead.take((4, 1)) == "four"
