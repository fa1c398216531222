"""Where a function skips its put: the early return of a missing put.

A missing put's culprit got a reference at a known call and, in released
objects, put it at known calls of its own.  Its machine code says where a way
past those puts branches off: from the instruction after the get's call, every
path is followed (both ways at a conditional branch, over calls) until it
reaches a put call, the get's call again (a loop's next reference) or leaves
the function (a `ret`, a jump or fall-through out of it).  A conditional
branch one side of which can reach a put and the other never does is where
the put is skipped, named by its line in the function's own code (past code
inlined into it); when no path reaches a put, the ways out are named.  For a
static helper that -O2 inlined, "the function" is the code DWARF attributes
to its inlined copy (the caller's instructions -O2 interleaves with it are
crossed, a few at a time).

At -O2 an early `return` often has no instruction of its own: the branch that
takes it is the place, and its line (the `if` that guards the return) is the
one named.  Nothing is named when the walk meets an indirect jump (a switch
table) or runs past its budget: a place is never guessed.
"""

from __future__ import annotations

from collections.abc import Callable

import capstone
from capstone import x86_const as X

from refcntd.symbolize.lines import Location
from refcntd.symbolize.modules import ModuleSymbols

BUDGET = 4096  # instructions walked for one culprit
LIMBO = 4  # instructions of other code an inlined copy's straight-line path may cross
NORETURN = frozenset({"abort", "exit", "_exit", "__stack_chk_fail", "__assert_fail",
                      "__fortify_fail", "g_assertion_message_expr", "__cxa_throw"})


def _disassembler() -> capstone.Cs:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return md


class ExitWalk:
    """The code of `function` (a symbol, or a function inlined into one) in `mod`
    reachable from the instruction after a get's call, up to a call returning to
    one of `puts`, the get's call itself again (a loop's next reference) or a way out."""

    def __init__(self, mod: ModuleSymbols, function: str, puts: set[int]) -> None:
        self.mod, self.function, self.puts = mod, function, puts
        self.md = _disassembler()
        self.succ: dict[int, list[int]] = {}
        self.branches: set[int] = set()  # conditional branches
        self.put_calls: set[int] = set()
        self.exits: set[int] = set()  # last instructions on a way out

    def skipped(self, start: int) -> list[int] | None:
        """Where the put is skipped, sorted: the conditional branches one side of which
        always misses every put while the other can reach one; else, when no path
        reaches a put, the ways out.  None when the walk could not be completed."""
        if not self.walk(start):
            return None
        reach = self._reaching()
        forks = [b for b in self.branches if b in reach
                 and any(n not in reach for n in self.succ[b] + ([] if len(self.succ[b]) > 1
                                                                  else [-1]))]
        return sorted(forks) if forks else sorted(self.exits) if not reach else []

    def walk(self, start: int) -> bool:
        physical = _base(self.mod.lookup(start)[0])
        if not physical or not self.in_scope(start, physical):
            return False
        todo = [start]
        self.succ[start] = []
        while todo:
            if len(self.succ) > BUDGET:
                return False
            addr = todo.pop()
            nexts = self._step(addr, physical, start)
            if nexts is None:
                return False
            self.succ[addr] = nexts
            for n in nexts:
                if n not in self.succ:
                    self.succ[n] = []
                    todo.append(n)
        return True

    def in_scope(self, addr: int, physical: str) -> bool:
        if _base(self.mod.lookup(addr)[0]) != physical:
            return False
        if _base(self.function) == physical:
            return True
        return any(name == self.function for name, _ in self.mod.inlined(addr))

    def _reaching(self) -> set[int]:
        """The instructions from which some path reaches a put call."""
        preds: dict[int, list[int]] = {}
        for a, ns in self.succ.items():
            for n in ns:
                preds.setdefault(n, []).append(a)
        reach, todo = set(self.put_calls), list(self.put_calls)
        while todo:
            for p in preds.get(todo.pop(), []):
                if p not in reach:
                    reach.add(p)
                    todo.append(p)
        return reach

    def _step(self, addr: int, physical: str, start: int) -> list[int] | None:
        """The instructions after the one at `addr` in the function, noting put calls,
        branches and ways out.  None: an indirect jump or undecodable code."""
        insn = next(self.md.disasm(self.mod.image.code_at(addr, 16), addr, 1), None)
        if insn is None:
            return None
        after = addr + insn.size
        if insn.group(X.X86_GRP_RET):
            self.exits.add(addr)
            return []
        if insn.group(X.X86_GRP_CALL):
            target = _direct(insn)
            if after in self.puts:
                self.put_calls.add(addr)
                return []
            if after == start or (target is not None and
                                  self.mod.lookup(target)[0] in NORETURN):
                return []  # the get again: the next reference, not this one
            return self._within([after], physical, addr, call=True)
        if insn.group(X.X86_GRP_JUMP):
            target = _direct(insn)
            if target is None:
                return None
            if insn.id == X.X86_INS_JMP:
                return self._within([target], physical, addr)
            self.branches.add(addr)
            return self._within([target, after], physical, addr)
        return self._within([after], physical, addr)

    def _within(self, nexts: list[int], physical: str, addr: int,
                call: bool = False) -> list[int]:
        """`nexts` in the function; one outside it that straight-line code does not bring
        back (-O2 interleaves the caller's instructions with an inlined copy's) makes
        `addr` a way out, unless it follows a call (one that never returns falls out)."""
        out = []
        for n in nexts:
            back = n if self.in_scope(n, physical) else self._back(n, physical)
            if back is not None:
                out.append(back)
            elif not call:
                self.exits.add(addr)
        return out

    def _back(self, addr: int, physical: str) -> int | None:
        """The first address in the function that straight-line code from `addr` (outside
        it) reaches within LIMBO instructions, None if it leaves or branches first."""
        for _ in range(LIMBO):
            insn = next(self.md.disasm(self.mod.image.code_at(addr, 16), addr, 1), None)
            if insn is None or insn.group(X.X86_GRP_RET) or insn.group(X.X86_GRP_JUMP):
                return None
            addr += insn.size
            if self.in_scope(addr, physical):
                return addr
        return None


def _direct(insn: capstone.CsInsn) -> int | None:
    ops = insn.operands
    if len(ops) == 1 and ops[0].type == X.X86_OP_IMM:
        return int(ops[0].imm)
    return None


def _base(function: str) -> str:
    """foo for foo.cold, foo.part.0: parts of one source function."""
    return function.split(".")[0]


def own_line(mod: ModuleSymbols, function: str) -> Callable[[int], Location]:
    """The line of an address in `function`'s own code: past functions inlined into it
    (the call of the outermost one below it), else the line table's."""
    def line(addr: int) -> Location:
        chain = mod.inlined(addr)
        names = [name for name, _ in chain]
        if function in names:
            i = names.index(function)
            return chain[i + 1][1] if i + 1 < len(chain) else mod.line(addr)
        return chain[0][1] if chain else mod.line(addr)
    return line
