"""Bundled spec libvirt: libvirt 9.0's own USDT probes, as Debian installs it.

The truth is counted twice without refcntd: by the program (the handles it
leaks) and by plain ftrace uprobe events on object_new / object_dispose (every
object libvirt created and did not dispose, the driver's included).
"""

from __future__ import annotations

import pytest
from catalog import Outcome, assert_balanced, assert_counts_whole, build, trace
from ftrace import UprobeEvent, live_at_end, traced

from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library
from refcntd.binary.sdt import sdt_probes, semaphore_file_offset

REGS = {"%rbx": "%bx", "%r12": "%r12", "%rax": "%ax", "%rbp": "%bp"}


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("virt"), "virtclient.c", ["libvirt"])


def lifecycle_events() -> list[UprobeEvent]:
    """object_new and object_dispose as plain uprobe events, their semaphores raised."""
    lib = resolve_library("libvirt.so.0", None)
    image = ElfImage(lib)
    wanted = {"libvirt:object_new", "libvirt:object_dispose"}
    return [UprobeEvent(p.name, lib, image.vaddr_to_offset(p.pc),
                        REGS[p.arg_text.split()[0].split("@")[1]],
                        semaphore_file_offset(image, p))
            for p in sdt_probes(image) if p.full_name in wanted]


def run_both(tmp_path, exe, variant: str) -> tuple[Outcome, set[int]]:
    with traced(lifecycle_events()) as kernel_trace:
        out = trace(tmp_path, "libvirt", [str(exe), variant])
    live = live_at_end(kernel_trace, out.process["pid"], "object_new", "object_dispose")
    assert any(e == "object_new" for _, e, _ in kernel_trace), "ftrace saw nothing"
    return out, live


def test_balanced_client_has_no_false_anomalies(bpf, exe, tmp_path):
    """50 lookup/ref/free rounds: object_dispose fires inside the last unref,
    before its object_unref probe; the spec's inside_last_put: before absorbs it."""
    out, live = run_both(tmp_path, exe, "balanced")
    assert live == set()
    assert_balanced(out)


def test_leaked_handles_and_what_they_keep_alive(bpf, exe, tmp_path):
    out, live = run_both(tmp_path, exe, "leak")
    assert {addr for _, addr in out.leaks} == live  # every undisposed object, no other
    for key, count in out.truth.items():  # the program's own handles, with their counts
        assert out.leaks[key] == count, (key, out.stderr)
    assert [a for a in out.anomalies if not a["separate"]] == []
    assert_counts_whole(out)


def test_double_free_is_rejected_by_libvirt_before_any_unref(bpf, exe, tmp_path):
    """virDomainFree on a freed handle fails libvirt's own handle check before
    virObjectUnref, so no unref event exists: nothing leaked, nothing false."""
    out, live = run_both(tmp_path, exe, "double")
    assert live == set()
    assert out.leaks == {} and out.anomalies == []
