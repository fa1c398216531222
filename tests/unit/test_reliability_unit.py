"""Bad input never produces a traceback: the YAML loaders, fuzzed (no BPF).  The rest of
RELIABILITY.md (the target never harmed, nothing left behind, nothing lost silently,
load) is tested in tests/bpf/test_reliability.py."""

from __future__ import annotations

import json


# ---- fuzzing the YAML loaders ---------------------------------------------------------
def test_yaml_loaders_never_raise_anything_but_config_errors(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from refcntd.errors import ConfigError
    from refcntd.inputs.config import load_config
    from refcntd.inputs.spec import load_spec

    keys = st.sampled_from(["version", "name", "roles", "init", "get", "put", "delete",
                            "functions", "object", "type", "initial_count", "usdt", "library",
                            "targets", "path", "spec", "listen", "retention", "max_age",
                            "history", "comm", "cgroup", "report_dir", "arg", "x"])
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12),
                        st.sampled_from(["arg1", "arg9", "return", "/bin/x", "a:b", "7d",
                                         "127.0.0.1:1", "perf-stubs", "", "\x00", "\u2603"]))
    trees = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)
    garbage = st.text(max_size=200)
    path = tmp_path / "fuzz.yaml"

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(trees.map(json.dumps), garbage))
    def check(text: str) -> None:
        path.write_text(text)
        for loader in (load_spec, load_config):
            try:
                loader(str(path))
            except ConfigError as err:
                assert err.path == str(path) and err.key and isinstance(err.lineno, int)
                assert "\n" not in err.message

    check()
