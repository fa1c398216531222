"""Objects whose count is 0 when their process ends: released, not leaked.

With a delete role (GObject's g_type_free_instance) the put that takes an object to
0 does not end its life; the delete does, after the finalize.  A process that exits
while another of its threads is finalizing (a GTask's pool thread) leaves objects at
count 0, whose delete never comes.  They hold no reference, and whether the exit
catches one depends on timing: listed as leaks (still reachable, "final count 0"),
they made the set of findings, and of JUnit cases, change from run to run (issue 54).
A delete a program never calls after its last put leaves the same count 0: a memory
leak, which valgrind's view shows, not a reference one.  Both are counted in a note.
"""

from __future__ import annotations

from dataclasses import replace

from refcntd.analysis.model import LeakGroup


def set_aside_released(groups: list[LeakGroup]) -> tuple[list[LeakGroup], str]:
    """`groups` without their objects at count 0, and the note that counts them ("" when
    there are none).  A group drained as columns is read only when it has one."""
    out, released = [], 0
    for group in groups:
        counts = getattr(group.objects, "counts", None)  # leaks.py's columns: cheap
        if counts is not None and 0 not in counts():
            out.append(group)
            continue
        kept = [o for o in group.objects if o.count != 0]
        released += len(group.objects) - len(kept)
        if kept:
            out.append(group if len(kept) == len(group.objects) else replace(group, objects=kept))
    if not released:
        return groups, ""
    return out, (f"{released} object(s) at count 0 when the process ended: released by their "
                 "last put, their delete not reached (a finalize under way on another thread, "
                 "or a delete never called); they hold no reference, and are not listed as "
                 "leaks")
