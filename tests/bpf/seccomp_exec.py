"""Load a seccomp allow list, then exec a command: systemd's SystemCallFilter= for a
test. Run by Debian's /usr/bin/python3, which has python3-seccomp (libseccomp).
Usage: seccomp_exec.py ERRNO_NAME SYSCALL,SYSCALL,... -- COMMAND ARGS..."""

import errno
import os
import sys

import seccomp  # Debian's python3-seccomp

errno_name, names, sep, *command = sys.argv[1:]
assert sep == "--" and command, __doc__
flt = seccomp.SyscallFilter(defaction=seccomp.ERRNO(getattr(errno, errno_name)))
for name in names.split(","):
    try:
        flt.add_rule(seccomp.ALLOW, name)
    except (RuntimeError, ValueError):
        pass  # a name this libseccomp or architecture does not know
flt.load()
os.execvp(command[0], command)
