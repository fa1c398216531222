"""What the soak records about `refcntd serve` each minute (benchmarks/soak.py): its
RSS, fds, threads and CPU from /proc, and every BPF map it holds (from its fds'
fdinfo: id, type, memlock; names and entry counts from bpftool), summed by name
over the tracers (one BPF program per attached binary)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

from refcntd.kernel.procfds import fd_kinds

# map types whose entries come and go (an array or a ring buffer is always full)
COUNTED = {"hash", "lru_hash", "percpu_hash", "lru_percpu_hash", "stack_trace"}
FDINFO_KEYS = ("map_type", "map_id", "memlock", "max_entries")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# A scrape in flight has its own thread and socket in serve (one per HTTP request,
# for a few ms): the +1 fd and thread the hour's soak saw at some pauses, while
# Prometheus' scrape was being served. The floor is the least of a few reads; a
# leak stays in every one of them.
FLOOR_READS, FLOOR_GAP_S = 5, 0.1


def process(pid: int) -> dict[str, float]:
    """RSS (MiB), open fds, threads and CPU seconds of `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    fds, threads = _floor(pid)
    return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
            "malloc_arenas": malloc_arenas(pid), "fds": fds, "threads": threads,
            "fd_kinds": fd_kinds(pid),
            "cpu_s": round((int(stat[11]) + int(stat[12])) / CLK_TCK, 1)}


def _floor(pid: int) -> tuple[int, int]:
    """Open fds and threads of `pid`, each the least of FLOOR_READS reads."""
    reads = []
    for i in range(FLOOR_READS):
        time.sleep(FLOOR_GAP_S if i else 0)
        reads.append((len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))))
    return min(r[0] for r in reads), min(r[1] for r in reads)


def malloc_arenas(pid: int) -> int:
    """glibc's thread arenas: read-write anonymous mappings at a 64 MiB boundary (the
    main arena is [heap])."""
    n = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start = int(fields[0].split("-")[0], 16)
        n += len(fields) == 5 and fields[1] == "rw-p" and start % (64 << 20) == 0
    return n


def _map_fds(pid: int) -> list[dict[str, int]]:
    """fdinfo of every BPF map fd of `pid` (map_type is the kernel's number)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-map":
                continue
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        out.append({k: int(info[k].strip()) for k in FDINFO_KEYS if k in info})
    return out


def _bpftool(*args: str) -> object:
    return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True,
                                     text=True, check=True, timeout=120).stdout)


def maps(pid: int) -> dict[str, object]:
    """{"maps": n, "memlock_kib": sum, "entries": {name: entries summed over tracers}}."""
    fds = _map_fds(pid)
    ids = {f["map_id"] for f in fds}
    shown = _bpftool("map", "show")
    entries: Counter[str] = Counter()
    for m in shown if isinstance(shown, list) else []:
        if m.get("id") not in ids or m.get("type") not in COUNTED:
            continue
        dump = _bpftool("map", "dump", "id", str(m["id"]))
        entries[str(m.get("name", m["id"]))] += len(dump) if isinstance(dump, list) else 0
    return {"maps": len(ids), "memlock_kib": sum(f.get("memlock", 0) for f in
                                                  {f["map_id"]: f for f in fds}.values()) // 1024,
            "entries": dict(sorted(entries.items()))}
