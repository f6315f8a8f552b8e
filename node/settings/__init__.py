"""Settings: every setting of a node, declared once, and what is made from the
declarations.

A setting is one field of `Settings` (`declarations`), declared with `setting(...)`
(`schema`). From the declarations come the config file's keys and checks (`config`),
the options of `meshminer node run` (`node/cli/settings_options.py`), what
`PUT /api/v1/policy` may change (`api_changes`) and docs/settings.md (`doc`). Values
are layered: defaults < `meshminer.toml` < `preferences.json` < flags. The package
reads files and checks values; it starts nothing and imports nothing of the node but
`node.preferences`, the volunteer's preferences, which `node/work` reads too.

This face re-exports what the rest of the node uses. `doc` stays out of it: it is the
entry point `python -m node.settings.doc`, which loads the face first and so
`config` too (the standard library only).

- `declarations`: `Settings`, every setting declared once; `SETTINGS`, `BY_NAME`,
  `API_KEYS`; `api_changes`, the API's changes converted and checked.
- `schema`: what declaring a setting takes (`setting`, `Setting`, `Bounds`), and the
  value checks every entry point shares (`ConfigError`).
- `config`: loading settings from their layers, saving the volunteer's changes
  (`preferences.json`), finding the data dir.
- `doc`: docs/settings.md, written from the declarations (`--check` only compares).
"""

from __future__ import annotations

from node.settings.config import (
    CONFIG_FILE,
    DEFAULT_DATA_DIR,
    SAVED_PREFERENCES,
    TABLES,
    data_dir_from,
    load_saved_preferences,
    load_settings,
    parse_config,
    save_preferences,
    settings_reference,
)
from node.settings.declarations import API_KEYS, BY_NAME, POLICY, SETTINGS, Settings, api_changes
from node.settings.schema import (
    MAX_TEXT,
    TYPES,
    Bounds,
    ConfigError,
    Setting,
    declared,
    from_json,
    from_toml,
    setting,
)

__all__ = [
    "API_KEYS",
    "BY_NAME",
    "CONFIG_FILE",
    "DEFAULT_DATA_DIR",
    "MAX_TEXT",
    "POLICY",
    "SAVED_PREFERENCES",
    "SETTINGS",
    "TABLES",
    "TYPES",
    "Bounds",
    "ConfigError",
    "Setting",
    "Settings",
    "api_changes",
    "data_dir_from",
    "declared",
    "from_json",
    "from_toml",
    "load_saved_preferences",
    "load_settings",
    "parse_config",
    "save_preferences",
    "setting",
    "settings_reference",
]
