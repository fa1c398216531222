"""The kernel struct offsets the unwinder is compiled with."""

from __future__ import annotations

import pytest

from refcntd.kernel import btf


def test_pending_uretprobe_offsets_are_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without return_instance in the kernel's BTF the CFI unwinder still runs (it then
    stops at a pending uretprobe's trampoline); with it, all its offsets are passed."""
    missing: set[str] = set()
    monkeypatch.setattr(btf, "member_offset",
                        lambda struct, member, path=None: None if struct in missing else 8)
    assert set(btf.unwind_offsets() or {}) == {*btf.UNWIND_MEMBERS, *btf.URETPROBE_MEMBERS}
    missing.add("return_instance")
    assert set(btf.unwind_offsets() or {}) == set(btf.UNWIND_MEMBERS)
    missing.add("super_block")
    assert btf.unwind_offsets() is None
