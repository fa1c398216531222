"""`python -m refcntd`."""

from refcntd.cli.main import entry

entry()
