"""`refcntd spec draft` on Debian's libgobject, libvirt and libcrypto as installed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, REFCNTD, assert_one_line_error, refcntd

from refcntd.binary.libpaths import resolve_library
from refcntd.binary.plan import build_plan
from refcntd.binary.specdraft import propose, render
from refcntd.errors import ConfigError
from refcntd.inputs.spec import load_spec


def pairs(library: str) -> dict[str, tuple[str, str, list[str]]]:
    draft = propose(resolve_library(library, None))
    return {t.stem: (t.get, t.put, t.constructors) for t in draft.types}


def test_gobject_pair_and_the_constructors_g_object_new_hands_over_to():
    found = pairs("libgobject-2.0.so.0")
    get, put, ctors = found["g_object"]
    assert (get, put) == ("g_object_ref", "g_object_unref")
    assert ctors == ["g_object_new_valist", "g_object_new_with_properties", "g_object_newv"]
    assert "g_object_weak" not in found  # weak references are not a count


def test_libcrypto_up_ref_free_pairs():
    found = pairs("libcrypto.so.3")
    assert found["X509"][:2] == ("X509_up_ref", "X509_free")
    assert {"X509_new", "d2i_X509", "X509_dup"} <= set(found["X509"][2])
    assert found["EVP_PKEY"][:2] == ("EVP_PKEY_up_ref", "EVP_PKEY_free")
    assert "EVP_PKEY_new" in found["EVP_PKEY"][2]
    assert found["BIO"][:2] == ("BIO_up_ref", "BIO_free")
    assert "BIO_new_ex" in found["BIO"][2] and "BIO_new" not in found["BIO"][2]  # via PLT


def test_libvirt_usdt_lifecycle_and_function_pairs():
    draft = propose(resolve_library("libvirt.so.0", None))
    (group,) = draft.usdt
    assert {r: p.full_name for r, p in group.probes.items()} == {
        "init": "libvirt:object_new", "get": "libvirt:object_ref",
        "put": "libvirt:object_unref", "delete": "libvirt:object_dispose"}
    assert any("inside_last_put" in u for u in draft.unplaced)
    stems = {t.stem: (t.get, t.put) for t in draft.types}
    assert stems["virDomain"] == ("virDomainRef", "virDomainFree")


@pytest.mark.parametrize("library", ["libgobject-2.0.so.0", "libvirt.so.0", "libcrypto.so.3"])
def test_a_draft_is_a_valid_spec_that_only_check_accepts(tmp_path, library):
    path = tmp_path / "draft.yaml"
    path.write_text(render(propose(resolve_library(library, None)), "d"))
    spec = load_spec(str(path), allow_draft=True)
    assert spec.draft and {"init", "get", "put"} <= spec.roles.keys()
    with pytest.raises(ConfigError, match="draft"):
        load_spec(str(path))


def test_cli_draft_then_check_lists_what_it_could_not_place(tmp_path):
    out = tmp_path / "gobject-draft.yaml"
    lib = resolve_library("libgobject-2.0.so.0", None)
    assert refcntd(["spec", "draft", "--library", lib, "--output", str(out)]).returncode == 0
    result = refcntd(["check", "--binary", lib, "--spec", str(out)])
    assert result.returncode != 0  # a draft is not a clean bill
    assert "UNPLACED (draft): g_param_spec" in result.stdout
    assert "a DRAFT" in result.stdout
    assert_one_line_error(refcntd(["run", "--spec", str(out), "--", "/bin/true"]), "draft")
    assert_one_line_error(refcntd(["spec", "draft", "--library", str(Path(tmp_path))]))


DOUBLE = """\
version: 1
name: double
library: libglib-2.0.so.0
roles:
  init:
    - {functions: [g_variant_new_int32, g_variant_new_from_bytes], object: return,
       type: {name: GVariant}}
    - {functions: [g_hash_table_new, g_hash_table_new_full], object: return,
       type: {name: GHashTable}}
  get: {functions: [g_variant_ref], object: arg1}
  put: {functions: [g_variant_unref], object: arg1}
  sink: {functions: [g_variant_ref_sink], object: arg1, floating_flag: {offset: 32, mask: 8}}
"""


def _jumps_to(library: str, caller: str, callee: str) -> bool:
    """objdump's truth: `caller`'s code has a call or jmp to `callee`."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)],
                         capture_output=True, text=True, check=True).stdout
    body = out.split(f"<{caller}@@Base>:\n", 1)[1].split("\n\n", 1)[0]
    return re.search(rf"\b(call|jmp)\s+[0-9a-f]+ <{callee}@", body) is not None


def test_check_finds_what_would_count_twice(tmp_path):
    """g_hash_table_new jumps to g_hash_table_new_full (tail call); in GLib 2.74
    (not 2.84) g_variant_new_int32 calls g_variant_new_from_bytes and
    g_variant_ref_sink calls g_variant_ref: each found where objdump finds it."""
    spec = tmp_path / "double.yaml"
    spec.write_text(DOUBLE)
    glib = resolve_library("libglib-2.0.so.0", None)
    problems = build_plan(load_spec(str(spec)), "/bin/true").problems
    expected = [
        "init: g_hash_table_new hands over to g_hash_table_new_full, both listed: each "
        "object would be created twice; keep g_hash_table_new_full only",
        "init: g_variant_new_int32 hands over to g_variant_new_from_bytes, both listed: each "
        "object would be created twice; keep g_variant_new_from_bytes only",
        "sink: g_variant_ref_sink calls g_variant_ref itself, which the get role already "
        "counts: drop the sink role for it"]
    truth = [_jumps_to(glib, "g_hash_table_new", "g_hash_table_new_full"),
             _jumps_to(glib, "g_variant_new_int32", "g_variant_new_from_bytes"),
             _jumps_to(glib, "g_variant_ref_sink", "g_variant_ref")]
    assert truth[0]
    assert sorted(problems) == [p for p, found in zip(expected, truth, strict=True) if found]


@pytest.mark.parametrize("spec", ["gobject", "glib", "gstreamer", "openssl", "cairo"])
def test_bundled_specs_count_nothing_twice(spec):
    assert build_plan(load_spec(spec), "/bin/true").problems == []


@pytest.mark.parametrize("stripped", [False, True])
def test_draft_of_a_users_unstripped_library_names_that_file(tmp_path, stripped):
    """A developer build has both .symtab and .dynsym: the exported API is found either
    way, and `library:` resolves to the very file that was read."""
    lib = tmp_path / "libbuf.so"
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-o", str(lib),
                    str(FIXTURES / "libbuf.c")], check=True)
    if stripped:
        subprocess.run(["strip", str(lib)], check=True)
    draft = propose(str(lib))
    assert [(t.stem, t.get, t.put, t.constructors) for t in draft.types] == \
        [("buf", "buf_ref", "buf_unref", ["buf_new"])]
    assert draft.library == str(lib)  # not on ld.so's path: the absolute path
    assert resolve_library(draft.library, None) == str(lib)


def test_draft_of_an_unstripped_executable(tmp_path):
    """The API linked into a program (its .symtab only: an executable exports nothing)."""
    exe = tmp_path / "bufstatic"
    subprocess.run(["gcc", "-O2", "-g", f"-I{FIXTURES}", "-o", str(exe),
                    str(FIXTURES / "bufprog.c"), str(FIXTURES / "libbuf.c")], check=True)
    draft = propose(str(exe))
    assert [(t.stem, t.get, t.put, t.constructors) for t in draft.types] == \
        [("buf", "buf_ref", "buf_unref", ["buf_new"])]
    assert draft.library == str(exe)


@pytest.mark.parametrize("named", ["absolute", "relative", "bare", "soname"])
def test_check_accepts_a_spec_whose_library_is_the_binary(tmp_path, named):
    """`spec draft --library ./libbuf.so`, confirmed, then `check --binary ./libbuf.so`:
    the spec's library is the --binary file however it is named, from any directory
    (issue 29: `library libbuf.so (named in the spec) not found`)."""
    lib = tmp_path / "lib" / "libbuf.so"
    lib.parent.mkdir()
    soname = ["-Wl,-soname,libbuf.so.1"] if named == "soname" else []
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", *soname, "-o", str(lib),
                    str(FIXTURES / "libbuf.c")], check=True)
    draft = tmp_path / "lib" / "draft.yaml"
    assert refcntd(["spec", "draft", "--library", str(lib), "--output", str(draft)]
                   ).returncode == 0
    library = {"absolute": str(lib), "relative": "./libbuf.so", "bare": "libbuf.so",
               "soname": "libbuf.so.1"}[named]
    text = draft.read_text()
    assert f"library: {lib}\n" in text  # not on ld.so's path: the file that was read
    spec = tmp_path / "lib" / "spec.yaml"  # confirmed: the draft line deleted
    spec.write_text(text.replace("draft: true\n", "").replace(str(lib), library))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([*REFCNTD, "check", "--binary", "../lib/libbuf.so", "--spec",
                             str(spec)], cwd=elsewhere, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"module {lib}\n" in result.stdout
    assert "put    buf_unref at " in result.stdout
    assert "init   buf_new at " in result.stdout
    missing = subprocess.run([*REFCNTD, "check", "--binary", "/bin/true", "--spec",
                              str(spec)], cwd=elsewhere, capture_output=True, text=True)
    if named in ("bare", "soname"):  # another binary: looked up as ld.so would, not found
        assert missing.returncode == 2 and "not found" in missing.stderr, missing.stderr


def users_libbuf(tmp_path: Path) -> Path:
    lib = tmp_path / "libbuf.so"
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-o", str(lib),
                    str(FIXTURES / "libbuf.c")], check=True)
    return lib


def test_check_on_a_draft_explains_it_then_exits_2_as_run_does(tmp_path):
    """The README's table: a draft is an input not confirmed yet (2), not an incomplete
    trace (24); check still shows its analysis first."""
    lib = users_libbuf(tmp_path)
    draft = tmp_path / "draft.yaml"
    assert refcntd(["spec", "draft", "--library", str(lib), "--output", str(draft)]
                   ).returncode == 0
    line = draft.read_text().splitlines().index("draft: true") + 1
    result = refcntd(["check", "--binary", str(lib), "--spec", str(draft)])
    assert result.returncode == 2, result.stderr
    assert "init   buf_new at " in result.stdout  # the analysis, shown first
    (verdict,) = [v for v in result.stdout.splitlines() if v.startswith("result:")]
    assert verdict.startswith("result: a DRAFT, not a spec yet (as proposed: every role can "
                              "be probed)")
    assert_one_line_error(result, f"{draft}:{line}: draft: a draft from `refcntd spec draft`")
    assert_one_line_error(refcntd(["run", "--spec", str(draft), "--", "/bin/true"]),
                          f"{draft}:{line}: draft: a draft from `refcntd spec draft`")


TYPOS = """\
version: 1
name: typos
library: {lib}
roles:
  init: {{functions: [buf_new], object: return, type: {{name: buf}}}}
  get: {{functions: [buf_ref, buf_reff], object: arg1}}
  put:
    functions: [buf_unreff]
    object: arg1
"""


def test_function_names_the_binary_lacks_are_spec_errors_all_at_once(tmp_path):
    """issue 29: `buf_unreff` exited 24 with no hint.  Every name the library's symbol
    table lacks, even beside a right one, is a spec error at its line, with the
    closest names the library has."""
    lib = users_libbuf(tmp_path)
    spec = tmp_path / "typos.yaml"
    spec.write_text(TYPOS.format(lib=lib))
    result = refcntd(["check", "--binary", str(lib), "--spec", str(spec)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"refcntd: {spec}:6: roles.get.functions[1]: get: no function buf_reff in {lib}; "
        "did you mean 'buf_ref'? (also close: 'buf_unref', 'buf_new')",
        f"refcntd: {spec}:8: roles.put.functions[0]: put: no function buf_unreff in {lib}; "
        "did you mean 'buf_unref'? (also close: 'buf_ref', 'buf_new')"]
    spec.write_text(TYPOS.format(lib=lib).replace("buf_reff", "xyzzy_frob")
                    .replace("buf_unreff", "buf_unref"))
    result = refcntd(["check", "--binary", str(lib), "--spec", str(spec)])
    assert_one_line_error(result, f"{spec}:6: roles.get.functions[1]: get: no function "
                                  f"xyzzy_frob in {lib}")
    assert "did you mean" not in result.stderr  # nothing close: no guess


def test_json_glib_draft_names_its_allocator_and_sized_constructor():
    """Debian's json-glib (a library no spec here was written on), named by its soname
    as a user would: json_node_alloc (the allocator every node constructor calls) and
    json_array_sized_new are proposed, json_node_new/copy as handing over to the
    allocator; GObject's g_param_spec_pool_new, another type's, stays out of
    g_param_spec (test above)."""
    result = refcntd(["spec", "draft", "--library", "libjson-glib-1.0.so.0"])
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)
    inits = {f for e in spec["roles"]["init"] for f in e["functions"]}
    assert {"json_node_alloc", "json_array_sized_new", "json_array_new",
            "json_object_new"} <= inits, inits
    assert not {"json_node_new", "json_node_copy"} & inits
    assert "hand over to these: json_node_copy, json_node_new" in result.stdout
