"""The bpf() system call for everything after the compile: maps, programs, ring buffer.

bcc is needed to compile bpf/refcntd.c (clang: 0.8-3.6 s here, and ~0.3 s just to
map libLLVM on a cold start).  Once the compiled instructions and the maps' layout
are in the cache (progcache), a start creates the maps and loads the programs
through the system call, reads and writes entries the same way, and consumes
the ring buffer with libbpf: bcc is not imported at all.  A compile goes through
here too (bcc's own maps are dropped), so the cached path is the only path.

Structures are the prefixes of `union bpf_attr` each command uses
(include/uapi/linux/bpf.h); the kernel zero-fills the rest.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator
from typing import Any

NR_BPF = 321  # x86_64

MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM, MAP_GET_NEXT_KEY = 0, 1, 2, 3, 4
PROG_LOAD, PROG_TEST_RUN, OBJ_GET_INFO_BY_FD, BTF_LOAD, BTF_GET_FD_BY_ID = 5, 10, 15, 18, 19
MAP_LOOKUP_BATCH, MAP_UPDATE_BATCH, MAP_DELETE_BATCH = 24, 26, 27
FIRST_BATCH = 256  # entries of a batch read's first buffers
LINK_CREATE = 28

MAP_HASH, MAP_ARRAY, MAP_PROG_ARRAY, MAP_PERCPU_HASH, MAP_PERCPU_ARRAY = 1, 2, 3, 5, 6
MAP_LRU_HASH, MAP_LRU_PERCPU_HASH, MAP_RINGBUF = 9, 10, 27
PER_CPU = frozenset({MAP_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_LRU_PERCPU_HASH})
ARRAYS = frozenset({MAP_ARRAY, MAP_PROG_ARRAY, MAP_PERCPU_ARRAY})
OBJ_NAME_MAX = 15  # BPF_OBJ_NAME_LEN, NUL aside: the name a map or program gets

PROG_KPROBE, PROG_TRACEPOINT, PROG_RAW_TRACEPOINT = 2, 5, 17
MAX_ARGS = 12  # MAX_BPF_FUNC_ARGS: a raw tracepoint program's context, u64 each

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MapCreate(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * 16),
                ("map_ifindex", ctypes.c_uint32), ("btf_fd", ctypes.c_uint32),
                ("btf_key_type_id", ctypes.c_uint32), ("btf_value_type_id", ctypes.c_uint32)]


class _Elem(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),  # value or next_key
                ("flags", ctypes.c_uint64)]


class _Batch(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _ProgLoad(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32)]


class _TestRun(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64)]


class _InfoByFd(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


class MapInfo(ctypes.Structure):
    """struct bpf_map_info, as far as refcntd reads it."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16), ("ifindex", ctypes.c_uint32),
                ("btf_vmlinux_value_type_id", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64),
                ("netns_ino", ctypes.c_uint64), ("btf_id", ctypes.c_uint32),
                ("btf_key_type_id", ctypes.c_uint32), ("btf_value_type_id", ctypes.c_uint32)]


class _BtfInfo(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_size", ctypes.c_uint32), ("id", ctypes.c_uint32)]


class _BtfLoad(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_log_buf", ctypes.c_uint64),
                ("btf_size", ctypes.c_uint32), ("btf_log_size", ctypes.c_uint32),
                ("btf_log_level", ctypes.c_uint32)]


class _IdAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32),
                ("open_flags", ctypes.c_uint32)]


def call(cmd: int, attr: ctypes.Structure) -> int:
    """bpf(cmd, &attr, sizeof attr); OSError with the errno on failure."""
    res = int(_libc.syscall(NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return res


def create_map(name: str, map_type: int, key_size: int, value_size: int, max_entries: int,
               flags: int, btf: tuple[int, int, int] | None = None) -> int:
    """`btf`: (BTF fd, key type id, value type id), so bpftool shows the fields."""
    attr = _MapCreate(map_type=map_type, key_size=key_size, value_size=value_size,
                      max_entries=max_entries, map_flags=flags,
                      map_name=_object_name(name))
    if btf is not None and btf[1] and btf[2]:
        attr.btf_fd, attr.btf_key_type_id, attr.btf_value_type_id = btf
    try:
        return call(MAP_CREATE, attr)
    except OSError as err:
        raise OSError(err.errno, f"creating map {name}: {err.strerror}") from None


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    call(OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                       info=ctypes.addressof(info)))
    return info


def btf_blob(btf_id: int) -> bytes:
    """The raw BTF a loaded object (a compile's maps) refers to, read back from the kernel;
    empty without CAP_SYS_ADMIN, which BTF_GET_FD_BY_ID needs and the shipped unit does
    not grant: the maps then load without BTF (it only names their types for bpftool)."""
    try:
        fd = call(BTF_GET_FD_BY_ID, _IdAttr(id=btf_id))
    except PermissionError:
        return b""
    try:
        info = _BtfInfo()
        call(OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                           info=ctypes.addressof(info)))
        buf = ctypes.create_string_buffer(info.btf_size)
        info = _BtfInfo(btf=ctypes.addressof(buf), btf_size=len(buf))
        call(OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                           info=ctypes.addressof(info)))
        return buf.raw[:info.btf_size]
    finally:
        os.close(fd)


def load_btf(blob: bytes) -> int:
    buf = ctypes.create_string_buffer(blob, len(blob))
    return call(BTF_LOAD, _BtfLoad(btf=ctypes.addressof(buf), btf_size=len(blob)))


def _object_name(name: str) -> bytes:
    """The kernel takes 15 characters of [A-Za-z0-9_.] as a map or program name."""
    return "".join(c if c.isalnum() or c in "_." else "_" for c in name)[:OBJ_NAME_MAX].encode()


def load_program(name: str, prog_type: int, code: bytes, attach_type: int = -1) -> int:
    """A program's fd; on refusal, OSError with the verifier's last lines."""
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = _ProgLoad(prog_type=prog_type, insn_cnt=len(code) // 8,
                     insns=ctypes.addressof(insns), license=ctypes.addressof(license_),
                     kern_version=_kernel_version(), prog_name=_object_name(name),
                     expected_attach_type=max(attach_type, 0))
    try:
        return call(PROG_LOAD, attr)
    except OSError as first:
        if first.errno not in (errno.EACCES, errno.EINVAL):  # not the verifier's answer
            raise OSError(first.errno, f"Failed to load BPF program {name}: "
                                       f"{first.strerror}") from None
    log = ctypes.create_string_buffer(1 << 24)  # only to explain a refusal: load again
    attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    try:
        return call(PROG_LOAD, attr)
    except OSError as err:
        tail = " / ".join(log.value.decode(errors="replace").strip().splitlines()[-3:])
        raise OSError(err.errno, f"Failed to load BPF program {name}: {err.strerror}"
                                 f"{'; verifier: ' + tail if tail else ''}") from None


def run_raw(fd: int, args: list[int]) -> int:
    """Run a raw tracepoint program once with these arguments (its ctx->args), in this
    thread (BPF_PROG_TEST_RUN, Linux 5.10+): its return value."""
    ctx = (ctypes.c_uint64 * MAX_ARGS)(*args[:MAX_ARGS])
    attr = _TestRun(prog_fd=fd, ctx_size_in=8 * min(len(args), MAX_ARGS),
                    ctx_in=ctypes.addressof(ctx))
    call(PROG_TEST_RUN, attr)
    return int(attr.retval)


def _kernel_version() -> int:
    """LINUX_VERSION_CODE of the running kernel (kprobe programs once had to carry it)."""
    parts = [int("".join(c for c in p if c.isdigit()) or 0)
             for p in os.uname().release.split("-")[0].split(".")[:3]]
    major, minor, patch = (parts + [0, 0, 0])[:3]
    return (major << 16) + (minor << 8) + min(patch, 255)


def possible_cpus() -> int:
    """Per-CPU maps hold a value for every possible CPU, not only the online ones."""
    text = open("/sys/devices/system/cpu/possible").read().strip()  # noqa: SIM115 - tiny
    return sum(int(b) - int(a) + 1 if "-" in r else 1
               for r in text.split(",") for a, _, b in [r.partition("-")])


class Table:
    """One map's entries as ctypes values: lookups, updates, deletes, iteration, batches.

    Per-CPU maps' values are `Leaf = value * possible CPUs` (each value a multiple
    of 8 bytes, as the kernel lays them out).  Keys and values handed out are
    copies, never views of a reused buffer."""

    def __init__(self, name: str, fd: int, map_type: int, key: Any, value: Any,
                 max_entries: int) -> None:
        self.name, self.map_fd, self.map_type, self.max_entries = name, fd, map_type, max_entries
        self.Key: Any = key
        self.Leaf: Any = value
        if map_type in PER_CPU:
            if ctypes.sizeof(value) % 8:
                raise ValueError(f"map {name}: per-CPU value of {ctypes.sizeof(value)} bytes")
            self.Leaf = value * possible_cpus()

    def _elem(self, key: Any, value: Any = None, flags: int = 0) -> _Elem:
        return _Elem(map_fd=self.map_fd, key=ctypes.addressof(key),
                     value=0 if value is None else ctypes.addressof(value), flags=flags)

    def __getitem__(self, key: Any) -> Any:
        key = self._as_key(key)
        value = self.Leaf()
        try:
            call(MAP_LOOKUP_ELEM, self._elem(key, value))
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise KeyError(key) from None
            raise
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        call(MAP_UPDATE_ELEM, self._elem(self._as_key(key), self._as_leaf(value)))

    def __delitem__(self, key: Any) -> None:
        key = self._as_key(key)
        try:
            call(MAP_DELETE_ELEM, self._elem(key))
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise KeyError(key) from None
            raise

    def keys(self) -> Iterator[Any]:
        """Every key, by BPF_MAP_GET_NEXT_KEY (entries may come and go meanwhile)."""
        key: Any = None
        while True:
            nxt = self.Key()
            attr = _Elem(map_fd=self.map_fd, key=0 if key is None else ctypes.addressof(key),
                         value=ctypes.addressof(nxt))
            try:
                call(MAP_GET_NEXT_KEY, attr)
            except OSError as err:
                if err.errno == errno.ENOENT:
                    return
                raise
            yield nxt
            key = nxt

    def items(self) -> list[tuple[Any, Any]]:
        out = []
        for key in self.keys():
            value = self.get(key)
            if value is not None:
                out.append((key, value))
        return out

    def lookup_batches(self, size: int) -> Iterator[tuple[ctypes.Array[Any],
                                                          ctypes.Array[Any], int]]:
        """(keys, values, n) per BPF_MAP_LOOKUP_BATCH of up to `size` entries; the
        buffers are reused between batches.  They start at FIRST_BATCH entries and
        double while batches come back full: a scrape reads several small maps per
        tracer, and zeroing `size` entries for each took most of its time (issue 43)."""
        cap = min(size, self.max_entries) if self.max_entries > 0 else size
        n_buf = min(cap, FIRST_BATCH)
        keys, values = (self.Key * n_buf)(), (self.Leaf * n_buf)()
        token = ctypes.c_uint64(0)  # the kernel's position: a bucket or an index
        attr = _Batch(out_batch=ctypes.addressof(token), map_fd=self.map_fd)
        while True:
            attr.keys, attr.values, attr.count = ctypes.addressof(keys), \
                ctypes.addressof(values), n_buf
            try:
                call(MAP_LOOKUP_BATCH, attr)
                done = False
            except OSError as err:
                if err.errno == errno.ENOSPC and n_buf < cap:  # a hash bucket larger
                    n_buf = min(cap, n_buf * 2)                # than the buffer: again
                    keys, values = (self.Key * n_buf)(), (self.Leaf * n_buf)()
                    continue
                if err.errno != errno.ENOENT:
                    raise OSError(err.errno, f"BPF_MAP_LOOKUP_BATCH: {err.strerror}") from None
                done = True
            if attr.count:
                yield keys, values, attr.count
            if done:
                return
            attr.in_batch = ctypes.addressof(token)
            if attr.count == n_buf and n_buf < cap:
                n_buf = min(cap, n_buf * 2)
                keys, values = (self.Key * n_buf)(), (self.Leaf * n_buf)()

    def items_lookup_batch(self) -> Iterator[tuple[Any, Any]]:
        for keys, values, n in self.lookup_batches(4096):
            for i in range(n):
                yield (self.Key.from_buffer_copy(keys, i * ctypes.sizeof(self.Key)),
                       self.Leaf.from_buffer_copy(values, i * ctypes.sizeof(self.Leaf)))

    def items_update_batch(self, keys: ctypes.Array[Any], values: ctypes.Array[Any]) -> None:
        call(MAP_UPDATE_BATCH, _Batch(keys=ctypes.addressof(keys), count=len(keys),
                                      values=ctypes.addressof(values), map_fd=self.map_fd))

    def items_delete_batch(self, keys: ctypes.Array[Any]) -> None:
        attr = _Batch(keys=ctypes.addressof(keys), count=len(keys), map_fd=self.map_fd)
        call(MAP_DELETE_BATCH, attr)

    def _as_key(self, key: Any) -> Any:
        return key if isinstance(key, ctypes._SimpleCData | ctypes.Structure) else self.Key(key)

    def _as_leaf(self, value: Any) -> Any:
        return value if isinstance(value, ctypes._SimpleCData | ctypes.Structure |
                                   ctypes.Array) else self.Leaf(value)


_SAMPLE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class RingBuffer:
    """libbpf's consumer of a BPF_MAP_TYPE_RINGBUF map (libbpf1, which bcc itself uses)."""

    def __init__(self, fd: int, callback: Callable[[Any, int, int], int]) -> None:
        self._lib = _libbpf()
        self._callback = _SAMPLE(callback)  # kept alive as long as the ring buffer
        self._rb = self._lib.ring_buffer__new(fd, self._callback, None, None)
        if not self._rb:
            err = ctypes.get_errno() or errno.EINVAL
            raise OSError(err, f"ring buffer: {os.strerror(err)}")

    def poll(self, timeout_ms: int) -> None:
        res = self._lib.ring_buffer__poll(self._rb, timeout_ms)
        if res < 0 and -res != errno.EINTR:
            raise OSError(-res, f"ring buffer: {os.strerror(-res)}")

    def close(self) -> None:
        if self._rb:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None


def _libbpf() -> Any:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.ring_buffer__new.restype = ctypes.c_void_p
    lib.ring_buffer__new.argtypes = [ctypes.c_int, _SAMPLE, ctypes.c_void_p, ctypes.c_void_p]
    lib.ring_buffer__poll.restype = ctypes.c_int
    lib.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.ring_buffer__free.restype = None
    lib.ring_buffer__free.argtypes = [ctypes.c_void_p]
    return lib
