"""The bpf() layer every start now goes through (kernel/bpfsys.py), on real kernel maps.

No compile is involved: maps are created by the system call, as a cached start
creates them, and read back through every access the loader uses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import pytest

from refcntd.kernel import abi, bpfsys


@pytest.fixture
def tables(bpf):
    made = []

    def make(map_type, key, value, entries, flags=0, name="t"):
        fd = bpfsys.create_map(name, map_type, ctypes.sizeof(key), ctypes.sizeof(value),
                               entries, flags)
        table = bpfsys.Table(name, fd, map_type, key, value, entries)
        made.append(fd)
        return table
    yield make
    for fd in made:
        os.close(fd)


def test_hash_lookup_update_delete_and_iteration(tables):
    t = tables(bpfsys.MAP_HASH, abi.ObjKey, abi.ObjVal, 1 << 14, 1)  # BPF_F_NO_PREALLOC
    info = bpfsys.map_info(t.map_fd)
    assert (info.type, info.key_size, info.value_size, info.max_entries, info.map_flags) == \
        (bpfsys.MAP_HASH, ctypes.sizeof(abi.ObjKey), ctypes.sizeof(abi.ObjVal), 1 << 14, 1)
    with pytest.raises(KeyError):
        t[abi.ObjKey(tgid=1, addr=2)]
    assert t.get(abi.ObjKey(tgid=1, addr=2)) is None
    for i in range(10000):  # more than one lookup batch of the items below (4096)
        t[abi.ObjKey(tgid=7 + i % 2, addr=i)] = abi.ObjVal(count=i, gen=3)
    assert t[abi.ObjKey(tgid=7, addr=42)].count == 42
    items = t.items()
    batched = list(t.items_lookup_batch())
    assert len(items) == len(batched) == 10000
    assert sorted((k.addr, v.count) for k, v in batched) == [(i, i) for i in range(10000)]
    assert sum(1 for _ in t.keys()) == 10000
    n = sum(n for _, _, n in t.lookup_batches(1000))
    assert n == 10000
    del t[abi.ObjKey(tgid=7, addr=42)]
    with pytest.raises(KeyError):
        del t[abi.ObjKey(tgid=7, addr=42)]
    doomed = (abi.ObjKey * 5000)(*[k for k, _ in batched if k.tgid == 8][:5000])
    t.items_delete_batch(doomed)
    assert len(t.items()) == 10000 - 1 - 5000
    assert all(k.tgid == 7 for k, _ in t.items())


def test_scalar_keys_come_back_as_ctypes_values(tables):
    t = tables(bpfsys.MAP_HASH, ctypes.c_uint32, abi.TypeName, 64)
    t[ctypes.c_uint32(5)] = abi.TypeName(b"conn")
    ((k, v),) = list(t.items_lookup_batch())
    assert (k.value, v.name) == (5, b"conn")
    ((k, v),) = t.items()
    assert (k.value, v.name) == (5, b"conn")


def test_per_cpu_values_have_one_slot_per_possible_cpu(tables):
    cpus = bpfsys.possible_cpus()
    assert cpus >= os.cpu_count() >= 1
    arr = tables(bpfsys.MAP_PERCPU_ARRAY, ctypes.c_int32, ctypes.c_uint64, 4)
    values = (ctypes.c_uint64 * cpus)(*range(1, cpus + 1))
    arr[ctypes.c_int(2)] = values
    assert list(arr[ctypes.c_int(2)]) == list(range(1, cpus + 1))
    assert sum(arr[ctypes.c_int(3)]) == 0
    h = tables(bpfsys.MAP_PERCPU_HASH, ctypes.c_uint32, abi.TypeTotals, 16)
    per_cpu = (abi.TypeTotals * cpus)()
    per_cpu[cpus - 1].gets = 9
    h[ctypes.c_uint32(1)] = per_cpu
    ((k, v),) = h.items()
    assert k.value == 1 and sum(c.gets for c in v) == 9
    ((k, v),) = list(h.items_lookup_batch())
    assert sum(c.gets for c in v) == 9


def test_array_batch_update(tables):
    t = tables(bpfsys.MAP_ARRAY, ctypes.c_int32, abi.ProbeCfg, 64)
    rows = (abi.ProbeCfg * 3)(*[abi.ProbeCfg(role=r) for r in (1, 2, 3)])
    t.items_update_batch((ctypes.c_int * 3)(10, 11, 12), rows)
    assert [t[ctypes.c_int(i)].role for i in (9, 10, 11, 12)] == [0, 1, 2, 3]
    assert t.max_entries == 64


def test_programs_load_and_a_refusal_says_why(bpf):
    ok = struct.pack("<BBhi", 0xB7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)  # r0=0; exit
    fd = bpfsys.load_program("ok", bpfsys.PROG_KPROBE, ok)
    os.close(fd)
    no_exit = struct.pack("<BBhi", 0xB7, 0, 0, 0)
    with pytest.raises(OSError) as err:
        bpfsys.load_program("bad", bpfsys.PROG_KPROBE, no_exit)
    assert err.value.errno in (errno.EINVAL, errno.EACCES)
    assert "verifier:" in str(err.value) and "bad" in str(err.value)
