"""What each caller may ask of the kernel side: one small Protocol per part of the
`Kernel` façade (loader.py), named by who uses it, so that a consumer's logic can be
tested with a fake of its part alone (as OTel's eBPF profiler hands each consumer a
narrow `EbpfHandler`).

| Protocol | real part | used by |
|---|---|---|
| `Probes` | probes.BpfProbes | session/tracer.py, session/vetting.py, service/ |
| `Objects` | objects.BpfObjects | session/lifecycle.py, session/tracer.py (stacks) |
| `TypeTable` | typetable.BpfTypeTable | session/typekeeper.py |
| `SiteMaps` | sitemaps.BpfSiteMaps | session/lifecycle.py, service/ (metrics, checkpoints) |
| `HoldMaps` | holdmaps.BpfHoldMaps | session/vetting.py |
| `UnwindMaps` | unwindmaps.BpfUnwindMaps | session/unwind.py |

loader.py has mypy check that each real part satisfies its Protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from refcntd.kernel import abi
from refcntd.kernel.abi import Stat
from refcntd.kernel.cfi import CfiTable
from refcntd.kernel.columns import ObjectColumns
from refcntd.kernel.records import (
    AgeBin,
    ObjectRecord,
    ProbeFailure,
    ReleasedSite,
    SiteLive,
    StackRecord,
    StackRef,
    Totals,
)

if TYPE_CHECKING:
    from refcntd.binary.probesite import ProbeSite

TypeIds = Callable[[str], int]  # a constant type name -> the id the BPF side gives it


class Probes(Protocol):
    """The plan's probes: configured, attached, added or disabled later, counted."""

    @property
    def sites(self) -> list[ProbeSite]: ...  # the plan's list: sites added later too
    @property
    def failed_probes(self) -> list[ProbeFailure]: ...
    def configure(self, type_ids: TypeIds, packed: bytes | None = None) -> None: ...
    def attach_all(self) -> None: ...
    def attach_ldso(self, path: str, sites: tuple[tuple[int, int], ...]) -> str | None: ...
    def attach_dlsym(self, path: str, offsets: list[int]) -> str | None: ...
    def add_sites(self, sites: list[ProbeSite], type_ids: TypeIds) -> list[int]: ...
    def disable_sites(self, indexes: list[int]) -> None: ...
    def hits(self) -> list[int]: ...
    def notes(self) -> list[str]: ...


class Objects(Protocol):
    """The objects a process leaves in the kernel, with their history and stacks."""

    @property
    def stacks_freed_early(self) -> int: ...
    def drain(self, tgid: int, gen: int | None) -> list[ObjectRecord]: ...
    def drain_columns(self, tgid: int, gen: int | None) -> ObjectColumns: ...
    def live_objects(self) -> list[ObjectRecord]: ...
    def released_sites(self, tgid: int) -> list[ReleasedSite]: ...
    def stack_record(self, stack_id: int) -> StackRecord | None: ...
    def forget_stacks(self, tgid: int, gen: int, refs: Iterable[StackRef]) -> None: ...
    def take_process_stats(self, tgid: int) -> dict[Stat, int]: ...
    def prune_process_stats(self, keep: Callable[[int], bool]) -> int: ...


class TypeTable(Protocol):
    """The kernel's fixed-size table of type names, and the totals of released objects."""

    def set_fixed(self, type_id: int, name: str) -> None: ...
    def count(self) -> int: ...
    def in_use(self) -> set[int]: ...
    def prune(self, keep: set[int]) -> dict[str, Totals]: ...
    def released_totals(self) -> dict[str, Totals]: ...


class SiteMaps(Protocol):
    """Live objects per allocation site and per creation time (SITES: serve, attach)."""

    def set_checkpoint(self, at_ns: int) -> None: ...
    def site_lives(self, unnamed: bool = False) -> list[SiteLive]: ...
    def take_sites(self, tgid: int, gen: int | None) -> list[SiteLive]: ...
    def age_bins(self, now_ns: int) -> list[AgeBin]: ...


class HoldMaps(Protocol):
    """Processes stopped when they map a module nobody scanned (exported call sites)."""

    @property
    def enabled(self) -> bool: ...
    def vet(self, keys: Iterable[abi.FileKey], owner: bool = False) -> None: ...
    def take_held(self) -> dict[int, abi.HoldKey]: ...
    def hold_function(self, key: abi.HoldKey, on: bool = True) -> None: ...


class UnwindMaps(Protocol):
    """The CFI tables and executable mappings the BPF unwinder reads."""

    @property
    def enabled(self) -> bool: ...
    @property
    def not_loaded(self) -> list[str]: ...  # tables that found no room
    def load_table(self, path: str, table: CfiTable | None = None) -> CfiTable | None: ...
    def seed_exec_maps(self, tgid: int, maps: list[tuple[int, int, int, int, int]]
                       ) -> None: ...
