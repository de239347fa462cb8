"""The path decision: precedence, reason codes, gates and config errors, over fake paths."""
from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from xla_compat import dispatch, rollout
from xla_compat.lazy.tensor import LazyTensor
from xla_compat.paths import PathImpl
from xla_compat.rollout import Reason
from xla_compat.settings import Settings


def fake(name, version="1.0", torch_versions=">=2.13", probe=lambda: None):
    return PathImpl(name=name, version=version, torch_versions=torch_versions,
                    tensor_cls=LazyTensor, probe=probe)


BOTH = {"legacy": fake("legacy", "L1", torch_versions=">=2.0"), "functional": fake("functional", "F1")}
JOB = "job-42"


def decide(impls=BOTH, **changes):
    s = Settings(job_id=JOB, job_id_source="XLA_JOB_ID", torch_version="2.13.0",
                 raw={"XLA_JOB_ID": JOB}).replace(**changes)
    return dispatch.decide(s, impls, library_version="9.9")


# One row per behaviour: settings -> (path, reason). Every reason code appears at least once.
TABLE = [
    (dict(), "legacy", Reason.DEFAULT),
    (dict(use_functionalization=True), "functional", Reason.EXPLICIT_FLAG),
    (dict(use_functionalization=False), "legacy", Reason.EXPLICIT_FLAG),
    (dict(use_functionalization=False, rollout_percentage=100.0), "legacy", Reason.EXPLICIT_FLAG),
    (dict(use_functionalization=True, rollout_deny=("job-*",)), "functional",
     Reason.EXPLICIT_FLAG),
    (dict(use_functionalization=True, min_torch_version="2.14"), "functional",
     Reason.EXPLICIT_FLAG),
    (dict(kill_switch=True), "legacy", Reason.KILL_SWITCH),
    (dict(kill_switch=True, use_functionalization=True), "legacy", Reason.KILL_SWITCH),
    (dict(kill_switch=True, dispatch_errors=("XLA_X='?': bad",)), "legacy", Reason.KILL_SWITCH),
    (dict(dispatch_errors=("XLA_USE_FUNCTIONALIZATION='maybe': bad",)), "legacy",
     Reason.CONFIG_ERROR),
    (dict(rollout_percentage=150.0, use_functionalization=True), "legacy", Reason.CONFIG_ERROR),
    (dict(rollout_percentage=-1.0), "legacy", Reason.CONFIG_ERROR),
    (dict(torch_version="not-a-version"), "legacy", Reason.CONFIG_ERROR),
    (dict(torch_version="2.1.0", use_functionalization=True), "legacy", Reason.VERSION_GATE),
    (dict(torch_version="2.1.0", rollout_percentage=100.0), "legacy", Reason.VERSION_GATE),
    (dict(torch_version="2.1.0", rollout_allow=("job-*",)), "legacy", Reason.VERSION_GATE),
    (dict(torch_version="2.1.0", rollout_deny=("job-*",), rollout_percentage=100.0), "legacy",
     Reason.VERSION_GATE),
    (dict(torch_version="2.1.0"), "legacy", Reason.DEFAULT),
    (dict(min_torch_version="2.14", rollout_percentage=100.0), "legacy", Reason.VERSION_GATE),
    (dict(min_torch_version="2.13", rollout_percentage=100.0), "functional",
     Reason.ROLLOUT_BUCKET),
    (dict(rollout_deny=("job-*",), rollout_allow=("job-42",), rollout_percentage=100.0),
     "legacy", Reason.DENY_LIST),
    (dict(rollout_allow=("job-4?",), rollout_percentage=0.0), "functional", Reason.ALLOW_LIST),
    (dict(rollout_allow=("other-*",), rollout_percentage=0.0), "legacy", Reason.ROLLOUT_BUCKET),
    (dict(rollout_percentage=100.0), "functional", Reason.ROLLOUT_BUCKET),
    (dict(rollout_percentage=0.0), "legacy", Reason.ROLLOUT_BUCKET),
    (dict(rollout_deny=("job-*",)), "legacy", Reason.DENY_LIST),
    (dict(rollout_percentage=100.0, job_id=None), "legacy", Reason.DEFAULT),
]


@pytest.mark.parametrize("changes, path, reason", TABLE,
                         ids=[f"{r.value}-{i}" for i, (_, _, r) in enumerate(TABLE)])
def test_decision_table(changes, path, reason):
    d = decide(**changes)
    assert (d.path, d.reason) == (path, reason), d.message


def test_every_reason_code_is_produced_by_some_row():
    assert {reason for _, _, reason in TABLE} == set(Reason)


# The precedence, checked over every combination of seven conditions.
CONDITIONS = {
    "kill": dict(kill_switch=True),
    "error": dict(dispatch_errors=("XLA_ROLLOUT_PERCENTAGE='x': expected a number",)),
    "flag": dict(use_functionalization=True),
    "old_torch": dict(torch_version="2.1.0"),
    "deny": dict(rollout_deny=("job-*",)),
    "allow": dict(rollout_allow=("job-*",)),
    "bucket": dict(rollout_percentage=100.0),
}


def expected_reason(on: set) -> Reason:
    if "kill" in on:
        return Reason.KILL_SWITCH
    if "error" in on:
        return Reason.CONFIG_ERROR
    if "flag" in on:
        return Reason.VERSION_GATE if "old_torch" in on else Reason.EXPLICIT_FLAG
    if "old_torch" in on and ({"allow", "bucket"} & on):
        return Reason.VERSION_GATE
    for name, reason in (("deny", Reason.DENY_LIST), ("allow", Reason.ALLOW_LIST),
                         ("bucket", Reason.ROLLOUT_BUCKET)):
        if name in on:
            return reason
    return Reason.DEFAULT


@pytest.mark.parametrize("mask", range(2 ** len(CONDITIONS)))
def test_precedence_holds_for_every_combination(mask):
    on = {name for i, name in enumerate(CONDITIONS) if mask >> i & 1}
    changes = {}
    for name in on:
        changes.update(CONDITIONS[name])
    d = decide(**changes)
    want = expected_reason(on)
    assert d.reason is want, f"{sorted(on)}: {d.reason} ({d.message})"
    to_functional = want in (Reason.EXPLICIT_FLAG, Reason.ALLOW_LIST, Reason.ROLLOUT_BUCKET)
    assert d.path == ("functional" if to_functional else "legacy")


# -- gates ----------------------------------------------------------------------------------------

def test_faked_old_torch_gates_functional_off_with_a_warning_naming_both_versions():
    d = decide(torch_version="2.1.0", use_functionalization=True)
    assert (d.path, d.reason, d.torch_version) == ("legacy", Reason.VERSION_GATE, "2.1.0")
    assert len(d.warnings) == 1 and "2.1.0" in d.warnings[0] and ">=2.13" in d.warnings[0]
    assert dict(d.supported)["functional"] is not None


def test_failed_capability_probe_gates_the_path_and_says_why():
    impls = dict(BOTH, functional=fake("functional", probe=lambda: "no torch._to_functional_tensor"))
    d = decide(impls, use_functionalization=True)
    assert (d.path, d.reason) == ("legacy", Reason.VERSION_GATE)
    assert "no torch._to_functional_tensor" in d.message


def test_a_probe_that_raises_counts_as_unsupported():
    def broken():
        raise AttributeError("module 'torch' has no attribute 'x'")
    impls = dict(BOTH, functional=fake("functional", probe=broken))
    d = decide(impls, rollout_percentage=100.0)
    assert (d.path, d.reason) == ("legacy", Reason.VERSION_GATE)
    assert "AttributeError" in d.message


def test_an_unregistered_requested_path_falls_back_with_version_gate():
    d = decide({"legacy": BOTH["legacy"]}, use_functionalization=True)
    assert (d.path, d.reason) == ("legacy", Reason.VERSION_GATE)
    assert "not registered" in d.message


def test_without_a_usable_legacy_path_the_safe_default_is_core():
    impls = {"core": fake("core", "0"), "functional": BOTH["functional"]}
    d = decide(impls, kill_switch=True)
    assert (d.path, d.reason) == ("core", Reason.KILL_SWITCH)
    assert any("'legacy' cannot run" in w for w in d.warnings)


def test_prerelease_and_local_torch_versions_are_gated_by_their_release():
    assert decide(torch_version="2.14.0.dev20260101+cpu", use_functionalization=True).path \
        == "functional"
    assert decide(impls=dict(BOTH, functional=fake("functional", torch_versions=">=2.13,<2.14")),
                  torch_version="2.14.0", use_functionalization=True).reason is Reason.VERSION_GATE


# -- config errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, field", [
    ("{bad json", "not valid JSON"),
    ('{"percentage": 150}', "'percentage'"),
    ('{"percentage": -1}', "'percentage'"),
    ('{"percentage": 5, "kill": true}', "unknown field 'kill'"),
    ('{"allow": 3}', "'allow'"),
])
def test_malformed_rollout_file_gives_config_error_and_the_safe_default(tmp_path, text, field):
    f = tmp_path / "rollout.json"
    f.write_text(text)
    d = decide(rollout_config=str(f), use_functionalization=True)
    assert (d.path, d.reason) == ("legacy", Reason.CONFIG_ERROR)
    assert field in d.message and "legacy" in d.message


def test_kill_switch_in_a_good_file_beats_the_flag(tmp_path):
    f = tmp_path / "rollout.toml"
    f.write_text("kill_switch = true\npercentage = 100\n")
    d = decide(rollout_config=str(f), use_functionalization=True)
    assert (d.path, d.reason) == ("legacy", Reason.KILL_SWITCH)


# -- the decision object ---------------------------------------------------------------------------

def test_decision_is_frozen_and_records_what_it_saw():
    d = decide(rollout_percentage=37.5, rollout_salt="s2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.path = "functional"
    assert d.bucket == rollout.bucket(JOB, "s2")
    assert (d.percentage, d.job_id, d.job_id_source) == (37.5, JOB, "XLA_JOB_ID")
    assert (d.torch_version, d.library_version) == ("2.13.0", "9.9")
    seen = dict(d.seen)
    assert seen["XLA_JOB_ID"] == JOB and seen["rollout.percentage"] == "37.5"
    assert seen["rollout.salt"] == "s2" and seen["rollout.kill_switch"] == "False"
    assert d.path_version == {"legacy": "L1", "functional": "F1"}[d.path]


def test_decision_as_dict_is_json_and_str_names_path_and_reason():
    d = decide(use_functionalization=True)
    data = json.loads(json.dumps(d.as_dict()))
    assert (data["path"], data["reason"], data["path_version"]) == \
        ("functional", "EXPLICIT_FLAG", "F1")
    text = str(d)
    assert "path: functional" in text and "EXPLICIT_FLAG" in text and "bucket" in text


def test_the_same_settings_give_the_same_decision():
    a = decide(rollout_percentage=50.0)
    b = decide(rollout_percentage=50.0)
    assert a == b
