"""What the BPF unwinder (bpf/unwind.h) reads: each file's CFI rows (cfi_rows,
cfi_modules) and the executable mappings of processes running before tracing
began (exec_maps)."""

from __future__ import annotations

import ctypes

from refcntd.kernel import abi, cfi, decode
from refcntd.kernel.cfi import CfiTable
from refcntd.kernel.maps import update_array
from refcntd.kernel.program import KernelOptions, Program

BUILD_ID_LEN = 20  # bytes of a GNU build-id (SHA-1), as cfi_module holds it


class BpfUnwindMaps:
    """Tables given once per file, while cfi_rows has room; does nothing unless the
    program unwinds (`enabled`)."""

    def __init__(self, program: Program, opts: KernelOptions) -> None:
        self.program, self.opts = program, opts
        self._tables: set[tuple[int, int]] = set()  # (ino, dev) of files given to BPF
        self._rows_used = 0
        self.not_loaded: list[str] = []  # cfi_rows full: shown as a note

    @property
    def enabled(self) -> bool:
        return self.opts.unwind_offsets is not None

    def load_table(self, path: str, table: CfiTable | None = None) -> CfiTable | None:
        """Give BPF the CFI table of the file at `path` (once per file; `table`: read
        already); None if not loaded."""
        key = decode.file_key(path)
        if key is None:
            return None
        if not self.enabled or (key.ino, key.dev) in self._tables:
            return None
        self._tables.add((key.ino, key.dev))
        table = table if table is not None else cfi.load_table(path)
        first = self._rows_used
        if first + table.count > self.opts.max_cfi_rows:
            self.not_loaded.append(path)
            self.mark_without_table(path)
            return None
        if table.count:
            update_array(self.program["cfi_rows"], first, abi.CfiRow, table.rows)
        self._rows_used += table.count
        self.program["cfi_modules"][key] = abi.CfiModule(
            first=first, count=table.count, flags=abi.MOD_FP if table.has_frame_pointers else 0,
            text_off=table.text_offset, build_id=(ctypes.c_uint8 * BUILD_ID_LEN)(*table.build_id))
        return table

    def mark_without_table(self, path: str) -> None:
        """An empty entry for a file whose table could not be had (unreadable, no
        .eh_frame, no room): its frames are walked with frame pointers as before, and
        a process mapping it is not stopped again to wait for a table (hold.h)."""
        key = decode.file_key(path)
        if key is None or not self.enabled:
            return
        self._tables.add((key.ino, key.dev))
        self.program["cfi_modules"][key] = abi.CfiModule(first=0, count=0, flags=0)

    def seed_exec_maps(self, tgid: int, maps: list[tuple[int, int, int, int, int]]) -> None:
        """Executable mappings (start, end, file offset, dev, ino) of a process that was
        running before tracing began (later ones are followed by the BPF side)."""
        if not self.enabled or not maps:
            return
        value = abi.ExecMaps(n=min(len(maps), abi.MAX_EXEC_MAPS))
        for i, (start, end, pgoff, dev, ino) in enumerate(maps[:abi.MAX_EXEC_MAPS]):
            value.m[i] = abi.ExecMap(start=start, end=end, pgoff=pgoff,
                                     file=abi.FileKey(ino=ino, dev=dev))
        self.program["exec_maps"][ctypes.c_uint32(tgid)] = value
