"""Every setting is declared once (`node.settings`), and each place that takes or shows
settings says the same: the options of `meshminer node run`, the config file's keys,
the keys `PUT /api/v1/policy` takes and docs/settings.md, with one help text."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from node.cli import app
from node.cli.settings_options import FLAGGED, overrides_from
from node.preferences import PreferenceError, Preferences
from node.settings.config import ConfigError, load_settings, parse_config, settings_reference
from node.settings.declarations import API_KEYS, SETTINGS, Settings, api_changes
from node.settings.doc import DOC_PATH, row, settings_markdown, toml_value
from node.settings.schema import TYPES, Setting
from protocol import Policy

#: settings set in the file (or the API) only, on purpose: no `node run` flag
FILE_ONLY = {
    "evidence_floor_mb",
    "relay_max_reservations",
    "relay_max_circuits",
    "relay_circuit_mb",
    "relay_circuit_s",
    "register_interval_s",
    "max_unit_download_mb",
    "unit_disk_quota_mb",
    "unit_files_keep_hours",
    "idle_load_pct",
}
#: `node run` options that are not settings
NOT_SETTINGS = {"data_dir", "rebenchmark"}


def _run_command() -> Any:
    """`meshminer node run` as typer builds it."""
    return typer.main.get_command(app).commands["node"].commands["run"]  # type: ignore[attr-defined]


def _doc_rows() -> dict[str, list[str]]:
    """docs/settings.md's table: key -> cells."""
    rows = {}
    for line in DOC_PATH.read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def _out_of_range(s: Setting) -> Any:
    """A value of the setting's type that breaks its rule."""
    if s.choices:
        return "bogus"
    assert s.bounds is not None
    if s.bounds.high is not None:
        bad: float = s.bounds.high + 1
    else:
        assert s.bounds.low is not None
        bad = s.bounds.low if s.bounds.low_open else s.bounds.low - 1
    if s.type.startswith("list"):
        return [int(bad)]
    return int(bad) if s.type == "int" else float(bad)


BOUNDED = [s for s in SETTINGS if s.bounds is not None or s.choices]


def test_each_declaration_is_complete() -> None:
    assert len({s.name for s in SETTINGS}) == len(SETTINGS) == len(fields(Settings))
    for s in SETTINGS:
        assert s.type in TYPES, s.name
        assert s.help and s.help == s.help.strip(), s.name
        # a table cell and a terminal show it as it is
        assert not any(c in s.help for c in "|<>`\n"), s.name
        assert getattr(Settings(), s.name) == s.default, s.name
        assert s.section in ("", "policy"), s.name
        assert not s.api or s.section == "policy", s.name


def test_every_setting_has_its_flag_in_node_run_with_the_same_help() -> None:
    params = {p.name: p for p in _run_command().params}
    assert {s.name for s in SETTINGS if not s.flag} == FILE_ONLY
    assert set(params) == {s.name for s in FLAGGED} | NOT_SETTINGS
    for s in FLAGGED:
        option = params[s.name]
        assert (*option.opts, *option.secondary_opts) == s.flags, s.name
        assert option.help == s.description, s.name
        assert option.default is None, s.name  # not given: the file's value stays
    assert set(overrides_from({})) == {s.name for s in FLAGGED}


def test_the_flags_keep_their_names() -> None:
    flags = {s.name: s.flag for s in FLAGGED}
    assert flags["load_limit_pct"] == "--load-limit"
    assert flags["publish_interval_s"] == "--publish-interval"
    assert flags["directory"] == "--directory/--no-directory"
    assert flags["accepting"] == "--accepting/--not-accepting"
    assert flags["allow_owners"] == "--allow-owner"


@pytest.mark.parametrize("s", [s for s in BOUNDED if s.flag], ids=lambda s: s.name)
def test_a_flag_out_of_range_stops_the_node_naming_the_key(s: Setting, tmp_path: Path) -> None:
    bad = _out_of_range(s)
    value = ",".join(map(str, bad)) if isinstance(bad, list) else str(bad)
    result = CliRunner().invoke(app, ["node", "run", "--data-dir", str(tmp_path), s.flag, value])
    assert result.exit_code == 2, result.output
    assert f"setting '{s.name}' " in result.output and "did not start" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_every_setting_is_a_key_of_the_config_file_in_its_table(s: Setting) -> None:
    line = f"{s.name} = {toml_value(s.default)}\n"
    here, elsewhere = (f"[{s.section}]\n{line}", line) if s.section else (line, f"[policy]\n{line}")
    assert parse_config(here) == {s.name: s.default}
    with pytest.raises(ConfigError, match=f"setting '.*{s.name}' in .* belongs in"):
        parse_config(elsewhere)
    with pytest.raises(ConfigError, match=f"unknown setting '.*{s.name}x'.*docs/settings.md"):
        parse_config(f"[{s.section}]\n{s.name}x = 1\n" if s.section else f"{s.name}x = 1\n")


@pytest.mark.parametrize("s", BOUNDED, ids=lambda s: s.name)
def test_a_value_out_of_range_in_the_file_is_refused_naming_the_key(
    s: Setting, tmp_path: Path
) -> None:
    bad = _out_of_range(s)
    with pytest.raises(ConfigError, match=f"setting '{s.name}' "):
        load_settings(tmp_path, {s.name: bad})
    assert s.rule() and s.rule() in s.description


def test_the_docs_table_is_what_the_declarations_write() -> None:
    assert DOC_PATH.read_text() == settings_markdown(), "run: python -m node.settings.doc"
    rows = _doc_rows()
    assert list(rows) == [s.key for s in SETTINGS]
    for s in SETTINGS:
        assert rows[s.key] == list(row(s)), s.name
        assert rows[s.key][4] == s.description, s.name
    assert [(r[0], r[3]) for r in settings_reference()] == [
        (s.key, s.description) for s in SETTINGS
    ]


def test_the_api_takes_the_policy_settings_and_no_other() -> None:
    assert tuple(s.name for s in SETTINGS if s.api) == API_KEYS
    # what the node keeps at runtime and shows as its preferences
    runtime = [f.name for f in fields(Policy)] + [f.name for f in fields(Preferences)]
    assert sorted(API_KEYS) == sorted(runtime)
    for s in SETTINGS:
        if s.api:
            assert api_changes({s.name: s.default}) == {s.name: s.default}
        else:
            with pytest.raises(PreferenceError, match=f"unknown preference '{s.name}'"):
                api_changes({s.name: s.default})


def test_policy_and_preferences_defaults_are_the_settings_defaults() -> None:
    declared = {s.name: s.default for s in SETTINGS}
    for default in (Policy(), Preferences()):
        for f in fields(default):
            assert getattr(default, f.name) == declared[f.name], f.name


@pytest.mark.parametrize("s", [s for s in BOUNDED if s.api], ids=lambda s: s.name)
def test_the_api_refuses_a_policy_value_out_of_range_naming_the_key(s: Setting) -> None:
    with pytest.raises(PreferenceError, match=f"^{s.name} .*{s.rule()[-4:].strip()}"):
        api_changes({s.name: _out_of_range(s)})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"accepting": "no"}, "accepting must be true or false"),
        ({"load_limit_pct": 50.5}, "load_limit_pct must be a whole number"),
        ({"max_job_hours": math.nan}, "max_job_hours must be a number"),
        ({"max_job_hours": math.inf}, "max_job_hours must be a number"),
        ({"gpus": "0, x"}, "gpus must be device indexes"),
        ({"allow_owners": "a b"}, "is not a peer id"),
        ({"hours": "x" * 1001}, "hours must be text"),
        ({"load_limit": 50}, "known: accepting, load_limit_pct, max_job_hours"),
    ],
)
def test_the_api_names_what_is_wrong(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(PreferenceError, match=message):
        checked = api_changes(changes)
        Settings(**checked).preferences().check()  # what the node then checks


def test_api_values_take_the_settings_types() -> None:
    assert api_changes({"gpus": "0, 1", "max_job_hours": 2, "load_limit_pct": 40.0}) == {
        "gpus": [0, 1],
        "max_job_hours": 2.0,
        "load_limit_pct": 40,
    }
    assert isinstance(api_changes({"max_job_hours": 2})["max_job_hours"], float)


def test_the_load_limit_has_one_description() -> None:
    load_limit = next(s for s in SETTINGS if s.name == "load_limit_pct")
    option = next(p for p in _run_command().params if p.name == "load_limit_pct")
    assert option.help == load_limit.description == _doc_rows()["policy.load_limit_pct"][4]
    assert "duty cycle" in load_limit.help and "schedulers" in load_limit.help


def test_a_name_or_team_that_is_not_plain_text_stops_the_node_naming_the_key() -> None:
    """They ride in every ad; peers would refuse an ad carrying them, so the node
    refuses to start with them."""
    for key, bad in (("name", "<b>Ada</b>"), ("team", "x" * 41), ("name", " padded")):
        with pytest.raises(ConfigError, match=f"setting '{key}': {key} must be"):
            Settings(**{key: bad}).check()
    Settings(name="Ada L.", team="Analytical Engines").check()
