"""The documentation stays true: docs/settings.md is the page the Settings model generates."""

from __future__ import annotations

from pathlib import Path

from drover.config import docs

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_has_a_description() -> None:
    missing = docs.missing_descriptions()
    assert not missing, (
        f"these settings have no description= in config/settings.py (docs/settings.md is "
        f"generated from it): {', '.join(missing)}; add one, then run `{docs.COMMAND}`")


def test_the_settings_page_is_what_the_settings_model_generates() -> None:
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == docs.render(), (
        f"docs/settings.md is out of date with config/settings.py: run `{docs.COMMAND}` "
        "and commit the page")
