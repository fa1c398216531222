"""The gdb half of benchmarks/holders_oracle.py: runs inside gdb (`gdb -batch -x`),
never imported by refcntd.

It runs under `refcntd run` (gdb a traced descendant, the program its child), so
that gdb reads the very process refcntd scans, at the very moment: refcntd's exit
hold stops the program at libc's `_exit` with a SIGSTOP (bpf/exithold.h); gdb sees
that signal, dumps, then waits for refcntd's SIGCONT (pending in /proc/PID/status)
before it lets the program go on, so refcntd's scan and gdb's read see the same
stopped memory.  Other SIGSTOPs (refcntd's holds at an exec or a module's mapping)
are waited out the same way.  Without a hold at `_exit` (no refcntd), it dumps at the
`exit_group` system call instead.  What it writes to $HOLDERS_ORACLE_OUT (a
directory), read by gdb through ptrace:

- every writable mapping's bytes (regions/N.bin) with /proc/PID/maps' line;
- each thread's registers (the general ones, rip, rsp), its frames (function, pc,
  rsp: gdb's unwind) and its `tcache` pointer;
- glibc's malloc state from libc6-dbg's symbols: `mp_.sbrk_base`, each arena's
  address, `top`, `fastbinsY`, and the sizes of `heap_info` and `struct malloc_state`;
- the structs named in $HOLDERS_ORACLE_CONFIG, flattened (offset, size, path, type)
  from the program's DWARF, for counts and names.
"""

from __future__ import annotations

import json
import os
import re
import time

import gdb  # type: ignore[import-not-found]

OUT = os.environ["HOLDERS_ORACLE_OUT"]
CONFIG = json.loads(os.environ.get("HOLDERS_ORACLE_CONFIG", "{}"))


def ev(expr: str) -> gdb.Value:
    return gdb.parse_and_eval(expr)


def flatten(t: gdb.Type, base: int = 0, path: str = "", depth: int = 0) -> list[list]:
    """Members of a struct as [offset, size, path, kind] (kind: the type's name or code)."""
    out: list[list] = []
    t = t.strip_typedefs()
    if t.code not in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION) or depth > 6:
        return out
    for f in t.fields():
        if not hasattr(f, "bitpos") or f.bitpos is None:
            continue
        off = base + f.bitpos // 8
        name = f"{path}.{f.name}" if f.name else path
        ft = f.type.strip_typedefs()
        kind = str(f.type.unqualified()) if ft.code != gdb.TYPE_CODE_PTR else "ptr"
        out.append([off, ft.sizeof, name, kind])
        if ft.code in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION):
            out.extend(flatten(ft, off, name, depth + 1))
    return out


def sig_pending(pid: int, signo: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return False
    bit = 1 << (signo - 1)
    return any(int(m, 16) & bit for m in re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)",
                                                      status, re.M))


def wait_cont(pid: int, limit_s: float = 60.0) -> bool:
    """Until refcntd's SIGCONT is pending (its hold is over)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if sig_pending(pid, 18):
            return True
        time.sleep(0.01)
    return False


def stop_reason() -> str:
    text = gdb.execute("info program", to_string=True)
    return text


def in_exit() -> bool:
    try:
        f = gdb.selected_frame()
        return (f.name() or "") in ("_exit", "__GI__exit", "_Exit")
    except gdb.error:
        return False


def main() -> None:
    for cmd in ("set pagination off", "set confirm off", "set breakpoint pending on",
                "set detach-on-fork on", "set follow-fork-mode parent",
                "set follow-exec-mode same", "set print thread-events off",
                "handle SIGPIPE nostop noprint pass", "handle SIGCONT nostop noprint pass",
                "handle SIGSTOP stop print nopass", "catch syscall exit_group"):
        gdb.execute(cmd, to_string=True)
    gdb.execute("run", to_string=True)
    holds, where = 0, ""
    while True:
        inf = gdb.selected_inferior()
        if not inf.pid:
            raise SystemExit("the program ended before _exit")
        reason = stop_reason()
        if "SIGSTOP" in reason:
            if in_exit():
                where = "refcntd's hold at _exit (SIGSTOP)"
                break
            holds += 1
            wait_cont(inf.pid)
            gdb.execute("continue", to_string=True)
            continue
        where = "the exit_group system call (no hold at _exit)"
        break
    dump(inf, where, holds)
    wait_cont(inf.pid, 30.0)
    while gdb.selected_inferior().pid:
        try:
            gdb.execute("continue", to_string=True)
        except gdb.error:
            break


def dump(inf: gdb.Inferior, where: str, holds: int) -> None:
    pid = inf.pid
    os.makedirs(os.path.join(OUT, "regions"), exist_ok=True)
    state: dict = {"pid": pid, "stopped_at": where, "other_holds": holds, "regions": [],
                   "threads": [], "arenas": [], "structs": {}}
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read().splitlines()
    for i, line in enumerate(maps):
        parts = line.split(None, 5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        perms, name = parts[1], parts[5] if len(parts) > 5 else ""
        entry = {"start": lo, "end": hi, "perms": perms, "name": name, "file": None}
        if "rw" in perms and name not in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
            try:
                data = bytes(inf.read_memory(lo, hi - lo))
            except gdb.MemoryError:
                data = None
            if data is not None:
                entry["file"] = f"regions/{i}.bin"
                with open(os.path.join(OUT, entry["file"]), "wb") as w:
                    w.write(data)
        state["regions"].append(entry)
    regs = ("rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip").split()
    for t in inf.threads():
        t.switch()
        th = {"tid": t.ptid[1], "name": t.name,
              "regs": {r: int(ev(f"${r}")) & (2**64 - 1) for r in regs}}
        frames = []
        try:
            f = gdb.newest_frame()
            while f is not None and len(frames) < 200:
                frames.append([f.name() or "", int(f.pc()),
                               int(f.read_register("rsp")) & (2**64 - 1)])
                f = f.older()
        except gdb.error as e:
            th["frames_error"] = str(e)
        th["frames"] = frames
        try:
            th["tcache"] = int(ev("(unsigned long)tcache"))
        except gdb.error as e:
            th["tcache_error"] = str(e)
        state["threads"].append(th)
    ms = gdb.lookup_type("struct malloc_state")
    state["malloc"] = {
        "sbrk_base": int(ev("(unsigned long)mp_.sbrk_base")),
        "heap_info_size": gdb.lookup_type("heap_info").sizeof,
        "malloc_state_size": ms.sizeof,
        "heap_max": 64 << 20,  # HEAP_MAX_SIZE: 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
        "main_arena": int(ev("(unsigned long)&main_arena")),
    }
    a = ev("&main_arena")
    seen = set()
    while int(a) not in seen:
        seen.add(int(a))
        s = a.dereference()
        state["arenas"].append({
            "address": int(a), "top": int(s["top"]),
            "fastbins": [int(s["fastbinsY"][i]) for i in range(10)],
            "system_mem": int(s["system_mem"])})
        a = s["next"]
    for name in CONFIG.get("structs", []):
        try:
            st = gdb.lookup_type(name)
            state["structs"][name] = {"size": st.sizeof, "members": flatten(st)}
        except gdb.error as e:
            state["structs"][name] = {"error": str(e)}
    with open(os.path.join(OUT, "state.json"), "w") as w:
        json.dump(state, w)


main()
