"""The documentation site: a generated page per hook, examples that load, tutorials that run.

`mkdocs build --strict` itself runs in `tox -e docs` and `.ci/run` (it needs the `docs`
extra); these tests need only the code.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
from pathlib import Path

import pluggy

from pi_workflows import hookspecs
from pi_workflows.event_types import EventType
from pi_workflows.testing import WorkflowHost

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference_pages = _load(DOCS / "reference_pages.py", "reference_pages")


def _code_blocks(page: Path, language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.DOTALL)


def test_every_hook_has_a_generated_page_with_its_contract_and_an_example():
    pages = reference_pages.pages()
    hooks = sorted(name for name in vars(hookspecs) if name.startswith("piw_"))

    missing = [hook for hook in hooks if f"reference/hooks/{hook}.md" not in pages]
    assert missing == [], f"hooks without a reference page: {missing}"
    for hook in hooks:
        page = pages[f"reference/hooks/{hook}.md"]
        assert f"def {hook}(" in page
        assert "**Built-in implementation:**" in page
        assert "**Implemented by the distributions in `plugins/`:**" in page
        assert "## Example plugin" in page and f"def {hook}(" in page.split("## Example")[1]
        assert f"[`{hook}`]({hook}.md)" in pages["reference/hooks/index.md"]
    markdown = pages["reference/hooks/piw_render_terminal_message.md"]
    assert "pi-workflows-markdown" in markdown and "pi_workflows.builtin.terminal" in markdown


def test_every_example_plugin_is_a_valid_plugin():
    for example in sorted((DOCS / "reference" / "hook-examples").glob("piw_*.py")):
        manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        manager.add_hookspecs(hookspecs)
        module = _load(example, f"example_{example.stem}")
        manager.register(module)
        manager.check_pending()
        implemented = {caller.name for caller in manager.get_hookcallers(module)}
        assert example.stem in implemented, example


def test_the_records_page_documents_every_typed_dict_field():
    page = reference_pages.pages()["reference/records.md"]

    for record in ("TerminalFacts", "ChannelRequest", "AgentStepRequest", "RunRecord"):
        assert f"## `{record}`" in page
    assert "## `_" not in page  # the module's private helpers are not records
    assert "| `terminalFingerprint` | `str (optional)` | sha-256 over" in page
    assert "| `origin_session_id` | `str \\| None` | the chat session" in page


def test_the_events_page_gives_every_event_type_a_meaning_and_the_v4_renames():
    page = reference_pages.pages()["reference/events.md"]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in page.splitlines()
        if line.startswith("| `")
    }

    undocumented = [member.value for member in EventType if not rows.get(f"`{member.value}`")]
    assert undocumented == []
    assert rows["`run.started`"].startswith("the run began at its first node")
    assert rows["`run_resumed`"] == "`run.relaunched`"


def test_the_tutorials_run_on_a_real_host(workflow_host: WorkflowHost):
    workflow = _code_blocks(DOCS / "tutorial" / "first-workflow.md")[0]
    plugin, plugin_test = _code_blocks(DOCS / "tutorial" / "first-plugin.md")
    failing = re.search(r'FAILING = """\n(.*?)"""', plugin_test, re.DOTALL).group(1)
    workflow_host.write_workflow("count-words", workflow)
    workflow_host.write_workflow("failing", failing)
    (workflow_host.project / "README.md").write_text("three little words\n")
    workflow_host.add_plugin("piw_brief_plugin", plugin)
    workflow_host.start()

    counted = workflow_host.start_run("count-words", {"file": "README.md"})
    failed = workflow_host.start_run("failing", session="chat-1")

    assert workflow_host.wait_for_run(counted)["finalOutput"] == {
        "file": "README.md",
        "words": 3,
    }
    workflow_host.wait_for_run(failed)
    message = workflow_host.wait_for_message("chat-1", failed)
    assert "In two sentences: say what failed" in message["content"]
    listed = json.loads(workflow_host.cli("workflows", "--json").stdout)
    assert "count-words" in json.dumps(listed)


def test_the_human_decision_example_runs_on_a_real_host(workflow_host: WorkflowHost):
    (example,) = [b for b in _code_blocks(DOCS / "decisions.md") if "human_decision(" in b]
    workflow_host.write_workflow(
        "ship",
        example.replace("\nhuman_decision(", "\nASK = human_decision(", 1)
        + "from pi_workflows import compute, switch, workflow\n"
        "WORKFLOW = workflow(name='ship', start_at='ask', nodes={'ask': ASK,"
        " 'held': compute(lambda ctx: ctx.outputs['ask'])},"
        " edges=[switch('ask', on='$.choice', cases={'hold': 'held', 'ship': 'held'})])\n",
    )
    workflow_host.start()

    run_id = workflow_host.start_run("ship", {"release": "1.2"})
    workflow_host.wait_for_status(run_id, "waiting")
    (decision,) = json.loads(workflow_host.cli("decision", "list", "--json").stdout)
    workflow_host.cli("decision", "answer", decision["decisionId"], "hold", "--input", "QA first")

    assert decision["title"] == "Ship 1.2?"
    continuation = "continuation-" + decision["decisionId"].removeprefix("decision-")
    assert workflow_host.wait_for_run(continuation)["finalOutput"] == {
        "choice": "hold",
        "input": {"why": "QA first"},
    }


def test_the_storage_example_keeps_a_hosts_state_where_it_says(
    workflow_host: WorkflowHost, tmp_path: Path
):
    example = (DOCS / "reference" / "hook-examples" / "piw_open_database.py").read_text()
    workflow_host.add_plugin("shared_storage", example)
    workflow_host.env.update(PI_WORKFLOWS_DATABASE="shared:team", PIW_SHARED_DIR=str(tmp_path))
    workflow_host.start()

    run_id = workflow_host.start_run("hello", {"name": "Ada"})
    assert workflow_host.wait_for_run(run_id)["status"] == "completed"

    database = tmp_path / "team.sqlite"
    with sqlite3.connect(database) as connection:
        runs = connection.execute("SELECT run_id, status FROM runs").fetchall()
        journal_mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
    assert runs == [(run_id, "completed")]
    assert journal_mode == "wal"  # the core's pragmas, though the plugin set none
    assert database.stat().st_mode & 0o777 == 0o600
    assert not (workflow_host.home.root / "state.sqlite").exists()
    unset = workflow_host.cli("state", "status", check=False, PIW_SHARED_DIR="")
    assert unset.returncode == 1
    assert unset.stderr.strip().endswith("shared: URLs need PIW_SHARED_DIR set to a directory.")
