"""Independent truth: leaked objects per type, counted from plain ftrace events.

Each codebase names its probes (tracefs.Probe) and what each event does to
the object it fetches (`obj=`): a Rule.  The books are kept per process
(tgid) and address; an object is leaked when its process ends with the
object alive at a count above zero.  Operations on objects never seen
created are kept apart (`unknown`), never counted as leaks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import tracefs

INIT = "init"  # the count starts at n (an entry probe on the initialiser)
INIT_RETURN = "init-return"  # the constructor returned it: +n (its init's own gets stay)
# a constructor that may return an object alive already, after a get on it (GObject's
# constructor returning a singleton, g_variant_get_child_value on a tree): +n only
# when the object is not alive
INIT_RETURN_NEW = "init-return-new"
GET = "get"
PUT = "put"
PUT_FREES = "put-frees"  # a put that ends the object's life at zero
DELETE = "delete"
CHECK = "check"  # no count change: only reads the object's flags (`flag`)


@dataclass(frozen=True)
class Rule:
    op: str
    type: str = ""  # a constant type; "" takes it from the event's name= argument
    count: int = 1
    # bits of the event's fl= argument that mark an object its library keeps on
    # purpose (GStreamer's MAY_BE_LEAKED, as its leaks tracer and refcntd's spec read
    # it): such an object is not counted as leaked
    flag: int = 0


@dataclass
class Life:
    type: str = ""
    count: int = 0
    created: bool = False


@dataclass
class Books:
    """Leaks at the end of a traced run, summed over its processes."""

    objects: Counter[str] = field(default_factory=Counter)  # type -> leaked objects
    kept: Counter[str] = field(default_factory=Counter)  # type -> flagged, not counted
    references: Counter[str] = field(default_factory=Counter)  # type -> leaked references
    unknown: int = 0  # operations on objects never seen created
    events: int = 0
    lost: int = 0
    returncode: int = 0

    def summary(self) -> dict[str, object]:
        return {"objects": dict(sorted(self.objects.items())),
                "references": dict(sorted(self.references.items())),
                "kept_flagged": dict(sorted(self.kept.items())),
                "unknown_ops": self.unknown, "events": self.events, "lost": self.lost}


def account(events: Sequence[tracefs.Event], rules: dict[str, Rule]) -> Books:
    lives: dict[tuple[int, int], Life] = {}
    flagged: set[tuple[int, int]] = set()
    books = Books(events=len(events))
    for ev in events:
        rule = rules.get(ev.name)
        if rule is None or "obj" not in ev.args:
            continue
        key = (ev.tgid, int(ev.args["obj"], 16))
        if rule.flag and int(ev.args.get("fl", "0"), 16) & rule.flag:
            flagged.add(key)
        if rule.op == CHECK:
            continue
        life = lives.setdefault(key, Life())
        if rule.op == INIT:
            flagged.discard(key)  # a new object at a freed one's address
            lives[key] = Life(rule.type or ev.args.get("name", "?"), rule.count, True)
        elif rule.op == INIT_RETURN_NEW and life.created and life.count > 0:
            pass
        elif rule.op in (INIT_RETURN, INIT_RETURN_NEW):
            life.type, life.created = rule.type or ev.args.get("name", "?"), True
            life.count += rule.count
        elif rule.op == GET:
            life.count += 1
        elif rule.op in (PUT, PUT_FREES):
            life.count -= 1
            if rule.op == PUT_FREES and life.count <= 0:
                del lives[key]
                flagged.discard(key)
        elif rule.op == DELETE:
            del lives[key]
            flagged.discard(key)
        if key in lives and not lives[key].created:
            books.unknown += 1
    for key, life in lives.items():
        if life.created and life.count > 0 and key in flagged:
            books.kept[life.type] += 1
        elif life.created and life.count > 0:
            books.objects[life.type] += 1
            books.references[life.type] += life.count
    return books


def count(cmd: Sequence[str], probes: Sequence[tracefs.Probe], rules: dict[str, Rule],
          env: dict[str, str] | None = None) -> Books:
    traced = tracefs.run(cmd, probes, env=env)
    books = account(traced.events, rules)
    books.lost, books.returncode = traced.lost, traced.returncode
    return books


def new_leaks(base: Books, mutant: Books) -> dict[str, int]:
    """Types with more leaked objects than the baseline: type -> how many more."""
    return {t: n - base.objects.get(t, 0) for t, n in mutant.objects.items()
            if n > base.objects.get(t, 0)}
