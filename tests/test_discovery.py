"""Discovery: precedence, broken files, source identity, the resolver and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pi_workflows import discovery
from pi_workflows.discovery import loader
from pi_workflows.errors import WorkflowSourceChangedError

GOOD = """
from pi_workflows import compute, workflow

WORKFLOW = workflow("{name}", "a", {{"a": compute(lambda ctx: {{"from": "{origin}"}})}}, [])
"""


@pytest.fixture
def layout(home_env, tmp_path: Path):
    project = tmp_path / "project"
    project_dir = project / ".pi" / "workflows"
    user_dir = home_env.config_dir / "workflows"
    project_dir.mkdir(parents=True)
    user_dir.mkdir()
    return project, project_dir, user_dir


def write(directory: Path, stem: str, text: str) -> Path:
    path = directory / f"{stem}.workflow.py"
    path.write_text(text)
    return path


def by_name(entries) -> dict:
    return {entry.name: entry for entry in entries}


def test_project_beats_user_beats_builtin(layout) -> None:
    project, project_dir, user_dir = layout
    write(project_dir, "hello", GOOD.format(name="hello", origin="project"))
    write(user_dir, "hello", GOOD.format(name="hello", origin="user"))
    write(user_dir, "mine", GOOD.format(name="whatever", origin="user"))
    found = by_name(discovery.discover(project))
    assert found["hello"].source["path"] == str((project_dir / "hello.workflow.py").resolve())
    assert found["mine"].definition.name == "whatever"  # the command name is the file stem
    assert found["shell"].source["kind"] == "builtin"
    assert list(found).count("hello") == 1


def test_broken_files_are_listed_while_others_load(layout) -> None:
    project, project_dir, _ = layout
    write(project_dir, "good", GOOD.format(name="good", origin="project"))
    write(project_dir, "syntax", "def oops(:\n")
    write(project_dir, "empty", "VALUE = 1\n")
    write(
        project_dir,
        "graph",
        "from pi_workflows import compute, workflow\n"
        "WORKFLOW = workflow('g', 'a', {'a': compute(len), 'b': compute(len)}, [])\n",
    )
    write(project_dir, "raises", "raise RuntimeError('no import for you')\n")
    found = by_name(discovery.discover(project))
    assert found["good"].error is None
    path = project_dir.resolve()
    assert found["syntax"].error.startswith(f"{path}/syntax.workflow.py:1: syntax error")
    assert found["empty"].error == f"{path}/empty.workflow.py: defines no module-level WORKFLOW"
    assert found["graph"].error == (
        f"{path}/graph.workflow.py: workflow 'g': node 'b' is not reachable from 'a'"
    )
    assert "RuntimeError while loading: no import for you" in found["raises"].error
    assert all("\n" not in (entry.error or "") for entry in found.values())


def test_source_hash_and_loading_by_source(layout) -> None:
    project, project_dir, _ = layout
    path = write(project_dir, "flow", GOOD.format(name="flow", origin="one"))
    first = by_name(discovery.discover(project))["flow"]
    definition = discovery.load_from_source(first.source, first.definition.definition_digest)
    assert definition.name == "flow"

    path.write_text(GOOD.format(name="flow", origin="two") + "\n# edited\n")
    second = by_name(discovery.discover(project))["flow"]
    assert second.source["hash"] != first.source["hash"]
    with pytest.raises(WorkflowSourceChangedError, match="changed since the run was created"):
        discovery.load_from_source(first.source)

    builtin = by_name(discovery.discover(project))["hello"]
    assert discovery.load_from_source(builtin.source).name == "hello"
    with pytest.raises(WorkflowSourceChangedError, match="another revision"):
        discovery.load_from_source({**builtin.source, "revision": "0" * 64})


def test_a_precompiled_file_loads_without_compiling_and_an_edit_compiles_again(
    layout, monkeypatch
) -> None:
    project, project_dir, _ = layout
    path = write(project_dir, "flow", GOOD.format(name="flow", origin="one"))
    source = by_name(discovery.discover(project))["flow"].source
    loader.precompile(path.resolve())  # what the worker fork server does after a launch
    compiled: list[str] = []
    monkeypatch.setattr(
        loader, "compile", lambda *args: compiled.append(args[1]) or compile(*args), raising=False
    )
    definition = discovery.load_from_source(source)
    assert compiled == [] and definition.nodes["a"].run(None) == {"from": "one"}
    # Other bytes at the same path are never served from the cache.
    path.write_text(GOOD.format(name="flow", origin="two"))
    edited = by_name(discovery.discover(project))["flow"].source
    compiled.clear()
    assert discovery.load_from_source(edited).nodes["a"].run(None) == {"from": "two"}
    assert compiled == [str(path.resolve())]


def test_definition_digest_changes_with_the_definition(layout) -> None:
    project, project_dir, _ = layout
    path = write(project_dir, "flow", GOOD.format(name="flow", origin="one"))
    before = by_name(discovery.discover(project))["flow"].describe()["definitionDigest"]
    path.write_text(
        GOOD.replace("compute(", "compute(status_detail='x', run=").format(
            name="flow", origin="one"
        )
    )
    after = by_name(discovery.discover(project))["flow"].describe()["definitionDigest"]
    assert before != after


def test_resolver_subprocess_and_cli(layout, home_env) -> None:
    project, project_dir, _ = layout
    write(project_dir, "good", GOOD.format(name="good", origin="project"))
    write(project_dir, "bad", "WORKFLOW = 3\n")
    resolved = discovery.resolve_in_subprocess("good", project)
    assert resolved["source"]["kind"] == "file" and len(resolved["definitionDigest"]) == 64
    echo = discovery.resolve_in_subprocess("echo", project)
    assert echo["presentationPrompt"].startswith("Relay the reply")
    assert "No workflow named 'nope'" in discovery.resolve_in_subprocess("nope", project)["error"]

    listed = home_env.run_cli("workflows", "--project", str(project), "--json")
    assert listed.returncode == 0, listed.stderr
    names = {entry["name"]: entry for entry in json.loads(listed.stdout)}
    assert {"good", "bad", "hello", "shell", "echo", "branch", "two-turn", "human-decision"} <= set(
        names
    )
    assert "WORKFLOW is a int" in names["bad"]["error"]
    text = home_env.run_cli("workflows", "--project", str(project))
    assert "bad  BROKEN: " in text.stdout
    assert f"good  {(project_dir / 'good.workflow.py').resolve()}" in text.stdout
