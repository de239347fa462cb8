"""Rollout controls: sticky buckets, the rollout config (environment and file) and its errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xla_compat import rollout
from xla_compat.rollout import Reason, RolloutConfig
from xla_compat.settings import Settings


# -- buckets ------------------------------------------------------------------------------------

def test_buckets_are_roughly_uniform_over_100000_job_ids():
    n = 100_000
    deciles = [0] * 10
    for i in range(n):
        deciles[rollout.bucket(f"job-{i}") * 10 // rollout.BUCKETS] += 1
    for d, count in enumerate(deciles):
        assert abs(count / n - 0.10) <= 0.02, f"decile {d} holds {count / n:.2%} of the jobs"


def test_bucket_is_in_range_and_depends_on_the_salt():
    ids = [f"train-{i}" for i in range(200)]
    a = [rollout.bucket(j, "salt-a") for j in ids]
    b = [rollout.bucket(j, "salt-b") for j in ids]
    assert all(0 <= x < rollout.BUCKETS for x in a + b)
    assert sum(x != y for x, y in zip(a, b)) > 190


def test_buckets_are_the_same_in_another_process_with_another_hash_seed():
    ids = [f"job-{i}" for i in range(50)] + ["", "ünïcode-job", "a" * 500]
    code = ("import json, sys; from xla_compat import rollout; "
            "print(json.dumps([rollout.bucket(j, 's1') for j in json.loads(sys.argv[1])]))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(ids)], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [rollout.bucket(j, "s1") for j in ids]


def test_raising_the_percentage_never_moves_a_job_back_out():
    ids = [f"job-{i}" for i in range(3000)]
    buckets = [rollout.bucket(j) for j in ids]
    previous: set = set()
    for pct in (0, 0.01, 0.5, 1, 5, 10, 25, 33.33, 50, 75, 99.99, 100):
        inside = {j for j, b in zip(ids, buckets) if rollout.in_rollout(b, pct)}
        assert previous <= inside, f"raising to {pct}% moved jobs out"
        previous = inside
    assert len(previous) == len(ids)


def test_percentage_edges_take_no_job_and_every_job():
    assert not any(rollout.in_rollout(b, 0) for b in range(rollout.BUCKETS))
    assert all(rollout.in_rollout(b, 100) for b in range(rollout.BUCKETS))
    assert sum(rollout.in_rollout(b, 12.34) for b in range(rollout.BUCKETS)) == 1234


# -- the rollout stage --------------------------------------------------------------------------

@pytest.mark.parametrize("config, job, to_target, reason", [
    (RolloutConfig(), "j", None, Reason.DEFAULT),
    (RolloutConfig(percentage=100), "j", True, Reason.ROLLOUT_BUCKET),
    (RolloutConfig(percentage=0), "j", False, Reason.ROLLOUT_BUCKET),
    (RolloutConfig(percentage=100, deny=("prod-*",)), "prod-7", False, Reason.DENY_LIST),
    (RolloutConfig(allow=("canary-*",), deny=("canary-*",)), "canary-1", False, Reason.DENY_LIST),
    (RolloutConfig(percentage=0, allow=("canary-*",)), "canary-1", True, Reason.ALLOW_LIST),
    (RolloutConfig(percentage=0, allow=("canary-*",)), "prod-1", False, Reason.ROLLOUT_BUCKET),
    (RolloutConfig(percentage=50), None, None, Reason.DEFAULT),
])
def test_rollout_stage_deny_beats_allow_beats_percentage(config, job, to_target, reason):
    out = rollout.evaluate(config, job)
    assert (out.to_target, out.reason) == (to_target, reason), out.detail


def test_glob_patterns_match_whole_job_ids_case_sensitively():
    assert rollout.matching("team-a/run-3", ["team-a/*"]) == "team-a/*"
    assert rollout.matching("team-ab", ["team-a"]) is None
    assert rollout.matching("Team-a", ["team-a"]) is None


# -- the config: file + environment -------------------------------------------------------------

def _file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_json_and_toml_files_give_the_same_config(tmp_path):
    j = _file(tmp_path, "r.json", json.dumps({"percentage": 12.5, "salt": "s", "allow": ["a*"],
                                              "deny": ["d*"], "min_torch_version": "2.13",
                                              "kill_switch": False}))
    t = _file(tmp_path, "r.toml", 'percentage = 12.5\nsalt = "s"\nallow = ["a*"]\n'
                                  'deny = ["d*"]\nmin_torch_version = "2.13"\nkill_switch = false\n')
    cj, ej = rollout.from_settings(Settings(rollout_config=j))
    ct, et = rollout.from_settings(Settings(rollout_config=t))
    assert ej == et == ()
    assert cj == ct == RolloutConfig(12.5, "s", ("a*",), ("d*",), "2.13", False)


def test_environment_overrides_the_file_field_by_field(tmp_path):
    f = _file(tmp_path, "r.json", json.dumps({"percentage": 10, "salt": "file-salt"}))
    config, errors = rollout.from_settings(Settings(rollout_config=f, rollout_percentage=60.0))
    assert errors == ()
    assert (config.percentage, config.salt) == (60.0, "file-salt")


def test_kill_switch_is_on_if_either_the_file_or_the_environment_says_so(tmp_path):
    f = _file(tmp_path, "r.json", json.dumps({"kill_switch": True}))
    assert rollout.from_settings(Settings(rollout_config=f, kill_switch=False))[0].kill_switch
    assert rollout.from_settings(Settings(kill_switch=True))[0].kill_switch
    assert not rollout.from_settings(Settings())[0].kill_switch


@pytest.mark.parametrize("name, text, field", [
    ("r.json", "{not json", "not valid JSON"),
    ("r.toml", "percentage = = 3", "not valid TOML"),
    ("r.json", '{"percentage": 150}', "'percentage'"),
    ("r.json", '{"percentage": -1}', "'percentage'"),
    ("r.json", '{"percentage": "50"}', "'percentage'"),
    ("r.json", '{"percentage": true}', "'percentage'"),
    ("r.json", '{"percentage": 10, "percentge": 20}', "unknown field 'percentge'"),
    ("r.json", '{"allow": "job-*"}', "'allow'"),
    ("r.json", '{"deny": [1, 2]}', "'deny'"),
    ("r.json", '{"salt": 7}', "'salt'"),
    ("r.json", '{"kill_switch": "yes"}', "'kill_switch'"),
    ("r.json", '{"min_torch_version": "two point thirteen"}', "'min_torch_version'"),
    ("r.json", "[1, 2]", "XLA_ROLLOUT_CONFIG"),
    ("r.yaml", "percentage: 5", "XLA_ROLLOUT_CONFIG"),
])
def test_malformed_rollout_file_gives_an_error_naming_the_field(tmp_path, name, text, field):
    config, errors = rollout.from_settings(Settings(rollout_config=_file(tmp_path, name, text)))
    assert len(errors) == 1 and field in errors[0], errors


def test_missing_rollout_file_gives_an_error_naming_the_variable(tmp_path):
    _, errors = rollout.from_settings(Settings(rollout_config=str(tmp_path / "nope.json")))
    assert len(errors) == 1 and "XLA_ROLLOUT_CONFIG" in errors[0] and "nope.json" in errors[0]


@pytest.mark.parametrize("changes, variable", [
    (dict(rollout_percentage=150.0), "XLA_ROLLOUT_PERCENTAGE"),
    (dict(rollout_percentage=-1.0), "XLA_ROLLOUT_PERCENTAGE"),
    (dict(rollout_percentage=float("nan")), "XLA_ROLLOUT_PERCENTAGE"),
    (dict(rollout_percentage="50"), "XLA_ROLLOUT_PERCENTAGE"),
    (dict(min_torch_version="latest"), "XLA_ROLLOUT_MIN_TORCH"),
    (dict(rollout_salt=""), "XLA_ROLLOUT_SALT"),
])
def test_malformed_setting_values_give_an_error_naming_the_variable(changes, variable):
    _, errors = rollout.from_settings(Settings(**changes))
    assert len(errors) == 1 and errors[0].startswith(variable), errors


# -- Settings.from_env: the dispatch variables never raise --------------------------------------

def test_dispatch_variables_are_parsed_from_the_environment():
    s = Settings.from_env({"XLA_USE_FUNCTIONALIZATION": "1", "XLA_ROLLOUT_PERCENTAGE": "2.5",
                           "XLA_ROLLOUT_ALLOW": "a-*, b-*", "XLA_ROLLOUT_DENY": "c",
                           "XLA_ROLLOUT_SALT": "s", "XLA_ROLLOUT_MIN_TORCH": "2.13",
                           "XLA_ROLLOUT_KILL_SWITCH": "0", "XLA_ROLLOUT_CONFIG": "/r.toml",
                           "XLA_JOB_ID": "job-9"})
    assert (s.use_functionalization, s.rollout_percentage, s.rollout_allow, s.rollout_deny,
            s.rollout_salt, s.min_torch_version, s.kill_switch, s.rollout_config) == \
        (True, 2.5, ("a-*", "b-*"), ("c",), "s", "2.13", False, "/r.toml")
    assert (s.job_id, s.job_id_source, s.dispatch_errors) == ("job-9", "XLA_JOB_ID", ())


@pytest.mark.parametrize("env, variable", [
    ({"XLA_USE_FUNCTIONALIZATION": "maybe"}, "XLA_USE_FUNCTIONALIZATION"),
    ({"XLA_ROLLOUT_PERCENTAGE": "ten"}, "XLA_ROLLOUT_PERCENTAGE"),
    ({"XLA_ROLLOUT_KILL_SWITCH": "2"}, "XLA_ROLLOUT_KILL_SWITCH"),
])
def test_malformed_environment_values_are_recorded_not_raised(env, variable):
    s = Settings.from_env(env)
    assert len(s.dispatch_errors) == 1 and s.dispatch_errors[0].startswith(variable)


@pytest.mark.parametrize("env, job_id, source", [
    ({"XLA_JOB_ID": "x", "TORCHELASTIC_RUN_ID": "t", "SLURM_JOB_ID": "s"}, "x", "XLA_JOB_ID"),
    ({"TORCHELASTIC_RUN_ID": "t", "SLURM_JOB_ID": "s"}, "t", "TORCHELASTIC_RUN_ID"),
    ({"SLURM_JOB_ID": "s", "XLA_JOB_ID": " "}, "s", "SLURM_JOB_ID"),
])
def test_job_id_comes_from_the_first_variable_set(env, job_id, source):
    s = Settings.from_env(env)
    assert (s.job_id, s.job_id_source) == (job_id, source)


def test_job_id_falls_back_to_hostname_and_script():
    import socket
    s = Settings.from_env({})
    assert s.job_id_source == "hostname+script"
    assert s.job_id.startswith(socket.gethostname() + ":")
