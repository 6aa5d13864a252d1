"""`pytest --scenarios`: which reference scenarios have a test, per section, without running any.

The catalog is the repository's copy of the reference scenario ids and titles
(`docs/scenarios.md`, one Markdown table per section; the ini option `scenario_catalog`
names another file). A row whose decision cell starts with `N/A` is not applicable and is
left out of the count. A test covers a scenario by carrying `@pytest.mark.scenario("id")`;
a mark naming an id the catalog does not hold (a typo, or a not-applicable id) stops the
run at collection, so no mark is silently counted for nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MARKER = "scenario"
DEFAULT_CATALOG = "docs/scenarios.md"
_SECTION = re.compile(r"^## (?P<title>.+)$")
_ROW = re.compile(
    r"^\|\s*(?P<id>(?:\d+|A)\.\d+)\s*\|\s*(?P<title>[^|]+?)\s*\|\s*(?P<decision>[^|]*?)\s*\|$"
)
_NOT_APPLICABLE = "N/A"


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    # Empty, "N/A: why" (left out of the count) or a note on how the project differs.
    decision: str

    @property
    def applicable(self) -> bool:
        return not self.decision.startswith(_NOT_APPLICABLE)


@dataclass
class Section:
    title: str
    scenarios: list[Scenario] = field(default_factory=list)


def read_catalog(path: Path) -> list[Section]:
    """The sections of a scenario catalog, in file order; a row before any section is an error."""
    sections: list[Section] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        heading = _SECTION.match(line)
        if heading:
            sections.append(Section(heading.group("title").strip()))
            continue
        row = _ROW.match(line.strip())
        if row is None:
            continue
        if not sections:
            raise pytest.UsageError(f"{path}:{number}: scenario row before any '## ' section")
        sections[-1].scenarios.append(
            Scenario(row.group("id"), row.group("title"), row.group("decision"))
        )
    if not any(section.scenarios for section in sections):
        raise pytest.UsageError(f"{path} holds no scenario rows ('| id | title | decision |')")
    return sections


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("pi-workflows").addoption(
        "--scenarios",
        action="store_true",
        help="instead of running tests, print per section which reference scenarios "
        "(docs/scenarios.md) have a test marked @pytest.mark.scenario and which do not",
    )
    parser.addini(
        "scenario_catalog",
        "the reference scenario catalog, relative to the rootdir",
        default=DEFAULT_CATALOG,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(id, ...): the test asserts the reference scenario(s) of that id "
        f"(catalog: {DEFAULT_CATALOG}; see pytest --scenarios)",
    )


def _catalog(config: pytest.Config) -> list[Section]:
    path = config.rootpath / config.getini("scenario_catalog")
    if not path.is_file():
        raise pytest.UsageError(f"scenario catalog {path} not found (ini option scenario_catalog)")
    return read_catalog(path)


def _marked_ids(item: pytest.Item) -> list[str]:
    return [str(value) for mark in item.iter_markers(MARKER) for value in mark.args]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(_marked_ids(item) for item in items) and not config.getoption("scenarios"):
        return
    scenarios = {s.id: s for section in _catalog(config) for s in section.scenarios}
    wrong = []
    for item in items:
        for scenario_id in _marked_ids(item):
            known = scenarios.get(scenario_id)
            if known is None:
                wrong.append(f"{item.nodeid}: scenario {scenario_id!r} is not in the catalog")
            elif not known.applicable:
                wrong.append(f"{item.nodeid}: scenario {scenario_id} is marked {known.decision}")
    if wrong:
        raise pytest.UsageError("scenario marks to fix:\n  " + "\n  ".join(wrong))


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def coverage_report(sections: list[Section], tested: set[str]) -> list[str]:
    """Lines: per section the tested ids and the untested ones with their titles, then totals."""
    lines: list[str] = []
    all_applicable = all_tested = not_applicable = 0
    for section in sections:
        applicable = [s for s in section.scenarios if s.applicable]
        covered = [s for s in applicable if s.id in tested]
        all_applicable += len(applicable)
        all_tested += len(covered)
        not_applicable += len(section.scenarios) - len(applicable)
        lines.append(
            f"{section.title}: {len(covered)}/{len(applicable)} tested "
            f"({_percent(len(covered), len(applicable))})"
        )
        if covered:
            lines.append("  tested:   " + " ".join(s.id for s in covered))
        for scenario in applicable:
            if scenario.id not in tested:
                note = f" [{scenario.decision}]" if scenario.decision else ""
                lines.append(f"  untested: {scenario.id} {scenario.title}{note}")
    lines.append(
        f"all: {all_tested}/{all_applicable} applicable scenarios tested "
        f"({_percent(all_tested, all_applicable)}); {not_applicable} not applicable"
    )
    return lines


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    config = session.config
    if not config.getoption("scenarios"):
        return None
    tested = {scenario_id for item in session.items for scenario_id in _marked_ids(item)}
    reporter = config.pluginmanager.getplugin("terminalreporter")
    reporter.section("reference scenarios")
    for line in coverage_report(_catalog(config), tested):
        reporter.write_line(line)
    return True
