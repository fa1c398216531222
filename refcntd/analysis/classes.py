"""Each leak group's class, from the scan's reading of its objects (reach/gtypes.py).

The spec's type says what the API is (`GObject`); the class says what the object is
(`JsonParser`).  A group (type, allocation stack) whose objects are of several
classes is split, one group per class, as a group of several kinds is: each class
gets its own count and line.  The group's key does not change (type and stack), so
a finding, its fingerprint, a baseline and a suppression stay what they were, also
in a run where a class could not be read (the process not held at exit, a class
unreadable): what is stable across runs is the key, what is read is shown beside it.
"""

from __future__ import annotations

from dataclasses import replace

from refcntd.analysis.model import LeakedObject, LeakGroup


def apply_classes(groups: list[LeakGroup], classes: dict[int, str]) -> list[LeakGroup]:
    """The groups split by their objects' class (objects not named: class "")."""
    if not classes:
        return groups
    out = []
    for group in groups:
        parts: dict[str, list[LeakedObject]] = {}
        for obj in group.objects:
            parts.setdefault(classes.get(obj.address, ""), []).append(obj)
        if len(parts) == 1:
            (name,) = parts
            out.append(replace(group, class_name=name))
            continue
        for name in sorted(parts):
            out.append(replace(group, objects=parts[name], class_name=name,
                               culprits=list(group.culprits)))
    return sorted(out, key=LeakGroup.order)
