"""Write docs/settings.md from the ``Settings`` model: ``python -m drover.config.docs``.

The page is generated, never edited by hand: each field's variable, type, default and
``description=`` come from config/settings.py, grouped under the ``# --- section ---`` comments
of the class, so the page cannot drift from what the code reads.
tests/integration/test_docs.py fails when the committed page differs from what this prints.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
import typing

import annotated_types
from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from drover.config.settings import ModelLimits, ModelPrice, Settings, TenantBudget

__all__ = ["COMMAND", "missing_descriptions", "render", "variables"]

COMMAND = "python -m drover.config.docs > docs/settings.md"

_NESTED = {ModelLimits: "model limits", TenantBudget: "tenant budgets",
           ModelPrice: "model prices"}
_SECTION = re.compile(r"^    # --- (.+?) -+$")
_FIELD = re.compile(r"^    (\w+): ")

# Variables read outside the Settings model (by one command each), kept here so the page has
# every DROVER_ variable in one place.
_OTHERS = (
    ("DROVER_FLOWER_BASIC_AUTH", "`drover flower`",
     "`user:password[,user2:pw2]`: Flower's basic auth, handed to Flower through its own "
     "`FLOWER_BASIC_AUTH`. Required when Flower listens beyond loopback, with passwords of at "
     "least 12 characters."),
    ("DROVER_GRAFANA_ADMIN_PASSWORD", "docker-compose.yml",
     "Grafana's admin password in the compose stack (default `admin`; viewers are anonymous)."),
)


def variables(name: str, field: FieldInfo) -> list[str]:
    """The environment variables that set ``name`` (an alias list replaces the prefixed name)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"DROVER_{name.upper()}"]


def missing_descriptions() -> list[str]:
    """Fields of Settings and its nested models with no ``description=`` (the page needs one)."""
    missing = []
    for model in (Settings, ModelLimits, TenantBudget, ModelPrice):
        for name, field in model.model_fields.items():
            if not (field.description or "").strip():
                missing.append(f"{model.__name__}.{name}")
    return missing


def _type_name(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (types.UnionType, typing.Union):
        inner = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(inner) + (", optional" if type(None) in args else "")
    if origin is dict:
        if args[1] in _NESTED:
            return f"JSON object of {_NESTED[args[1]]} (see below)"
        return f"JSON object (name -> {_type_name(args[1])})"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if annotation is SecretStr:
        return "secret string"
    if isinstance(annotation, type):
        return {"str": "string", "bool": "boolean", "int": "integer", "float": "number"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation)


def _bounds(field: FieldInfo) -> str:
    marks = []
    metadata = list(field.metadata)
    for item in list(metadata):  # PositiveRate's gt=0 arrives as a FieldInfo of its own
        metadata.extend(getattr(item, "metadata", []))
    for item in metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attr, None)
            if isinstance(item, annotated_types.BaseMetadata) and value is not None:
                marks.append(f"{sign} {value:g}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            marks.append(f"matching `{pattern}`")
    return ", ".join(dict.fromkeys(marks))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _sections() -> list[tuple[str, list[str]]]:
    """The class's ``# --- section ---`` comments with the fields under each, in order."""
    sections: list[tuple[str, list[str]]] = []
    for line in inspect.getsource(Settings).splitlines():
        if match := _SECTION.match(line):
            sections.append((match.group(1).strip(), []))
        elif (match := _FIELD.match(line)) and match.group(1) in Settings.model_fields:
            if not sections:
                sections.append(("settings", []))
            sections[-1][1].append(match.group(1))
    return sections


def _entry(name: str, field: FieldInfo) -> list[str]:
    names = " or ".join(f"`{variable}`" for variable in variables(name, field))
    kind = _type_name(field.annotation)
    bounds = _bounds(field)
    text = " ".join((field.description or "(no description)").split())
    return [
        f"### {names}",
        "",
        f"{kind}{f' ({bounds})' if bounds else ''}; default {_default(field)}.",
        "",
        text,
        "",
    ]


def _nested(model: type[BaseModel]) -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        bounds = _bounds(field)
        kind = _type_name(field.annotation) + (f" ({bounds})" if bounds else "")
        text = " ".join((field.description or "(no description)").split())
        lines.append(f"- `{name}`: {kind}, default {_default(field)}. {text}")
    return lines


def render() -> str:
    """The whole page, as docs/settings.md holds it."""
    lines = [
        "# Settings",
        "",
        f"<!-- Generated from config/settings.py by `{COMMAND}`; do not edit. -->",
        "",
        "drover reads its settings from environment variables (or a `.env` file in the working",
        "directory). Every value is checked when a process starts: a wrong one stops it with a",
        "message that names the variable and says what to put there, e.g.",
        "`DROVER_RPM: Input should be greater than 0 (got '-1')` (exit code 2).",
        "Every host of one deployment needs the same values (see [deployment](deployment.md)).",
        "",
        "JSON-valued settings are written as JSON: `DROVER_LIMITS='{\"claude-haiku-4-5\":",
        "{\"rpm\": 50}}'`. Durations end in `_s` and are in seconds.",
        "",
    ]
    for title, names in _sections():
        if not names:  # the "derived" properties
            continue
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        for name in names:
            lines += _entry(name, Settings.model_fields[name])
    lines += [
        "## Inside the JSON values",
        "",
        "One model's limits in `DROVER_LIMITS` (per minute, as the console shows them):",
        "",
        *_nested(ModelLimits),
        "",
        "One tenant's budget in `DROVER_TENANT_BUDGETS` (input + output tokens):",
        "",
        *_nested(TenantBudget),
        "",
        "One model's prices in `DROVER_PRICES` (dollars per million tokens):",
        "",
        *_nested(ModelPrice),
        "",
        "## Read by one command each",
        "",
    ]
    for variable, reader, text in _OTHERS:
        lines += [f"### `{variable}`", "", f"Read by {reader}. {text}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    missing = missing_descriptions()
    if missing:
        print(f"these settings have no description= in config/settings.py: "
              f"{', '.join(missing)}", file=sys.stderr)
        return 1
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
