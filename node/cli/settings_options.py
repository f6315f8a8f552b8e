"""The options of `meshminer node run` that set settings, made from their declarations
(`node.settings`): flag, help text, default and type come from there, so `--help`,
the config file and docs/settings.md say the same."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.models import OptionInfo

from node.settings import SETTINGS, Setting

#: the option's value type on the command line, by the setting's type
_CLI_TYPES: dict[str, Any] = {
    "str": str | None,
    "bool": bool | None,
    "int": int | None,
    "float": float | None,
    "list[str]": list[str] | None,
    "list[int]": str | None,  # "0,1" or "0 1"
}
#: the settings that have a flag
FLAGGED: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.flag)


def _shown_default(s: Setting) -> str:
    if s.type == "bool":
        return s.flags[0 if s.default else 1]
    if isinstance(s.default, list):
        return "none" if not s.default else ",".join(str(v) for v in s.default)
    if isinstance(s.default, float):
        return f"{s.default:g}"
    return str(s.default) if s.default != "" else '""'


def option(s: Setting) -> OptionInfo:
    """The typer option of setting `s` (None when not given: the file's value stays)."""
    return typer.Option(
        s.flag,
        help=s.description,
        show_default=_shown_default(s),
        metavar=s.metavar,
    )


def _parameter(s: Setting) -> inspect.Parameter:
    return inspect.Parameter(
        s.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[_CLI_TYPES[s.type], option(s)],
    )


def overrides_from(values: dict[str, Any]) -> dict[str, Any]:
    """Option values (by setting name) as `node.settings.config.load_settings` takes them:
    None for each one not given; a list flag given no times is not given."""
    overrides: dict[str, Any] = {}
    for s in FLAGGED:
        value = values.get(s.name)
        if s.type == "list[int]" and value is not None:
            value = _int_list(value, s.flags[0])
        elif s.type.startswith("list"):
            value = list(value) if value else None
        overrides[s.name] = value
    return overrides


def _int_list(text: str, flag: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split() if p]
    if not all(p.isdigit() for p in parts):
        raise typer.BadParameter('device indexes like "0,1"', param_hint=flag)
    return [int(p) for p in parts]


def with_setting_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with an option for every setting that has a flag, after its first
    parameter; `fn` gets them as `overrides`, keyed by setting name (see
    `overrides_from`), and its own parameters as they are."""
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(fn, eval_str=True).parameters.values()
        if p.name != "overrides"
    ]
    names = {s.name for s in FLAGGED}

    def command(**values: Any) -> Any:
        settings = {k: values.pop(k) for k in list(values) if k in names}
        return fn(overrides=overrides_from(settings), **values)

    params = [*own[:1], *(_parameter(s) for s in FLAGGED), *own[1:]]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = fn.__name__
    command.__qualname__ = fn.__qualname__
    command.__doc__ = fn.__doc__
    command.__module__ = fn.__module__
    return command
