"""benchmarks/mutants/truth.account: objects their library flags "may be leaked"
(GStreamer's allocators, system clock, task pool, static caps) are not counted as
leaked, as GStreamer's leaks tracer and refcntd's spec treat them."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "mutants"))

import tracefs  # noqa: E402
import truth  # noqa: E402

RULES = {"new": truth.Rule(truth.INIT_RETURN, "GObject"), "ref": truth.Rule(truth.GET),
         "unref": truth.Rule(truth.PUT), "check": truth.Rule(truth.CHECK, flag=1),
         "free": truth.Rule(truth.DELETE)}


def ev(name: str, obj: int, fl: int | None = None) -> tracefs.Event:
    args = {"obj": hex(obj)} | ({"fl": hex(fl)} if fl is not None else {})
    return tracefs.Event(1, name, args)


def test_a_flagged_object_alive_at_exit_is_kept_not_leaked() -> None:
    books = truth.account([ev("new", 0x10), ev("check", 0x10, 0x1), ev("ref", 0x10),
                           ev("new", 0x20), ev("ref", 0x20), ev("check", 0x20, 0x2)], RULES)
    assert books.objects == {"GObject": 1}  # 0x20: its flags lack the bit
    assert books.kept == {"GObject": 1}


def test_a_freed_flagged_address_reused_by_a_new_object_counts_again() -> None:
    books = truth.account([ev("new", 0x10), ev("check", 0x10, 0x1), ev("unref", 0x10),
                           ev("free", 0x10), ev("new", 0x10), ev("ref", 0x10)], RULES)
    assert (books.objects, books.kept) == ({"GObject": 1}, {})


def test_a_constructor_returning_an_object_alive_already_adds_no_reference() -> None:
    """GObject's constructor returning a singleton it refs, g_variant_get_child_value
    on a tree child: new only when not alive (INIT_RETURN_NEW); INIT_RETURN counts it
    twice, so the singleton's last unref would leave it leaked."""
    rules = {**RULES, "new": truth.Rule(truth.INIT_RETURN_NEW, "GObject")}
    seq = [ev("new", 0x10), ev("ref", 0x10), ev("new", 0x10), ev("unref", 0x10),
           ev("unref", 0x10), ev("free", 0x10), ev("ref", 0x30), ev("new", 0x30)]
    books = truth.account(seq, rules)
    assert books.objects == {"GObject": 1}  # 0x30: its init's own get, then made: 2 refs
    assert books.references == {"GObject": 2}
    assert truth.account(seq[:5], RULES).objects == {"GObject": 1}
    assert truth.account(seq[:5], rules).objects == {}
