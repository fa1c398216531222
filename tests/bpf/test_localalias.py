"""A put that calls itself (a child's unref dropping its parent, as HarfBuzz's
hb_unicode_funcs_destroy does): gcc -O2 -fPIC gives the recursive call a local alias,
`node_unref.localalias`, at the function's own address.  It is not a copy: the
probe on node_unref counts those calls, and check and run must not refuse it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import LIBRARY_SPEC, leak_summary, refcntd

LIB = """#include <stdlib.h>
struct node { int refs; struct node *parent; };
struct node *node_new(struct node *parent)
{ struct node *n = calloc(1, sizeof *n); n->refs = 1; n->parent = parent; return n; }
struct node *node_ref(struct node *n) { n->refs++; return n; }
__attribute__((noinline)) void node_unref(struct node *n)
{ if (n && --n->refs == 0) { node_unref(n->parent); free(n); } }
"""
PROG = """#include <stdlib.h>
struct node;
struct node *node_new(struct node *parent);
struct node *node_ref(struct node *n);
void node_unref(struct node *n);
int main(int argc, char **argv)
{
    for (int i = 0; i < 4; i++) {
        struct node *root = node_new(NULL);
        struct node *leaf = node_new(node_new(root));  /* leaf -> mid -> root */
        node_unref(leaf);  /* frees leaf, mid and root through the recursive calls */
    }
    struct node *kept = node_new(NULL);
    if (argc > 1) node_unref(kept);
    return 0;
}
"""


def build(root: Path) -> tuple[Path, Path]:
    (root / "node.c").write_text(LIB)
    (root / "main.c").write_text(PROG)
    lib, prog = root / "libnode.so", root / "nodeprog"
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-o", str(lib),
                    str(root / "node.c")], check=True)
    subprocess.run(["gcc", "-O2", "-g", "-o", str(prog), str(root / "main.c"), f"-L{root}",
                    "-lnode", f"-Wl,-rpath,{root}"], check=True)
    return lib, prog


def test_a_recursive_puts_local_alias_is_counted_by_its_probe(bpf, tmp_path):
    lib, prog = build(tmp_path)
    symbols = subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
    assert "node_unref.localalias" in symbols  # the case this test is about
    spec = tmp_path / "node.yaml"
    spec.write_text(LIBRARY_SPEC.format(type="node", library=lib, new="node_new",
                                        ref="node_ref", unref="node_unref"))
    check = refcntd(["check", "--binary", str(prog), "--spec", str(spec)])
    assert check.returncode == 0, check.stdout
    assert "node_unref.localalias: node_unref's own code under a local name" in check.stdout
    clean = refcntd(["run", "--spec", str(spec), "--", str(prog), "free"], tmp_path / "c.json")
    assert clean.returncode == 0, clean.stderr
    assert clean.report["leaked_objects"] == 0  # every root and mid freed through the alias
    leaky = refcntd(["run", "--spec", str(spec), "--", str(prog)], tmp_path / "l.json")
    (process,) = leaky.report["processes"]
    assert leak_summary(process) == {"node": [1]}  # only `kept`
