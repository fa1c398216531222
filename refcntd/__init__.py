"""refcntd: reference-count leak tracer for unmodified native programs."""

__version__ = "0.1.0"
