"""The launcher that starts pi on the Node installed next to it (piw_pi/launcher/pi.mjs).

It defers two modules Pi imports at start (cli-highlight with highlight.js, jiti's Babel
bundle) to their first use, and keeps module resolutions inside Pi's node_modules between
starts. These tests run small scripts through the launcher on that Node in place of Pi's
CLI: importing the same Pi modules pi does, the deferred module is not loaded at start and
the first call still does the real work; in a node_modules of their own, a kept resolution
is used until npm changes that node_modules, and one from elsewhere is never kept.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from piw_pi.node import DISTRIBUTION_DIR, PI_LAUNCHER

from tests.pi.offline_pi import bundled_node

NODE_MODULES = DISTRIBUTION_DIR / "node_modules"
PI_THEME = NODE_MODULES / "@mariozechner/pi-coding-agent/dist/modes/interactive/theme/theme.js"
JITI_STATIC = NODE_MODULES / "jiti/lib/jiti-static.mjs"

# Whether a CommonJS module whose path contains `part` has been loaded in this process.
LOADED = """
import { createRequire } from "node:module";
const cache = createRequire(import.meta.url).cache;
const loaded = (part) => Object.keys(cache).some((path) => path.includes(part));
"""

HIGHLIGHT = (
    LOADED
    + """
const theme = await import(process.env.PI_THEME_URL);
const atStart = loaded("/highlight.js/");
theme.initTheme("dark");
const lines = theme.highlightCode("answer = 42", "python");
console.log(JSON.stringify({ atStart, afterUse: loaded("/highlight.js/"), lines }));
"""
)

TRANSPILE = (
    LOADED
    + """
const { createJiti } = await import(process.env.JITI_STATIC_URL);
const atStart = loaded("/jiti/dist/babel.cjs");
// No transpile cache: jiti has to run Babel on this TypeScript.
const jiti = createJiti(import.meta.url, { fsCache: false, moduleCache: false });
const module = await jiti.import(process.env.TS_MODULE, { default: true });
const afterUse = loaded("/jiti/dist/babel.cjs");
console.log(JSON.stringify({ atStart, afterUse, value: module(20) }));
"""
)


def run_through_launcher(
    tmp_path: Path,
    script: str,
    env: dict[str, str],
    cli: Path | None = None,
    cache: Path | None = None,
) -> dict:
    """Run `script` as the launcher's "CLI" (at `cli`) on the bundled Node, with its caches
    in `cache` (default: a private directory in tmp_path); the script's JSON line."""
    cli = cli or tmp_path / "cli.mjs"
    cli.parent.mkdir(parents=True, exist_ok=True)
    cli.write_text(script)
    if cache is None:
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run(
        [str(bundled_node()), str(PI_LAUNCHER), str(cache), str(cli)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_highlighting_is_loaded_on_first_use_and_still_colours_code(tmp_path):
    seen = run_through_launcher(
        tmp_path, HIGHLIGHT, {"PI_THEME_URL": PI_THEME.as_uri(), "FORCE_COLOR": "1"}
    )
    assert seen["atStart"] is False, "highlight.js was loaded with Pi's modules"
    assert seen["afterUse"] is True
    (line,) = seen["lines"]
    assert "answer" in line and "42" in line
    assert "\x1b[" in line, f"the code was not coloured: {line!r}"


def test_babel_is_loaded_on_first_use_and_still_transpiles_an_extension(tmp_path):
    module = tmp_path / "extension.ts"
    module.write_text(
        "type Doubled = number;\n"
        "export default function double(value: number): Doubled {\n"
        "    return value * 2;\n"
        "}\n"
    )
    seen = run_through_launcher(
        tmp_path, TRANSPILE, {"JITI_STATIC_URL": JITI_STATIC.as_uri(), "TS_MODULE": str(module)}
    )
    assert seen["atStart"] is False, "jiti's Babel bundle was loaded at start"
    assert seen["afterUse"] is True
    assert seen["value"] == 40


# A CLI in a node_modules of its own that imports a package there, and a module from
# elsewhere (like a user's extension) that imports the same name.
RESOLVING = """
import inside from "inside";
const { default: outside } = await import(process.env.OUTSIDE_URL);
console.log(JSON.stringify({ inside, outside }));
"""


def package(directory: Path, main: str) -> None:
    """A CommonJS package at `directory` whose `main` is `main`; one.js and two.js export
    their names."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "package.json").write_text(json.dumps({"name": directory.name, "main": main}))
    for name in ("one", "two"):
        (directory / f"{name}.js").write_text(f"module.exports = {name!r};\n")


def pi_like_install(tmp_path: Path) -> tuple[Path, Path]:
    """A node_modules holding package `inside` (one.js) and npm's .package-lock.json, and an
    extension outside it that imports "inside" too; (the CLI's path, the extension's)."""
    node_modules = tmp_path / "pi" / "node_modules"
    package(node_modules / "inside", "one.js")
    (node_modules / ".package-lock.json").write_text("{}")
    # Without a package of its own, the extension's "inside" is found in Pi's node_modules.
    extension = tmp_path / "pi" / "project" / "extension.mjs"
    extension.parent.mkdir()
    extension.write_text('export { default } from "inside";\n')
    return node_modules / "app" / "cli.mjs", extension


def test_resolutions_inside_pis_node_modules_are_kept_until_npm_changes_it(tmp_path):
    cli, extension = pi_like_install(tmp_path)
    env = {"OUTSIDE_URL": extension.as_uri()}
    node_modules = cli.parent.parent
    npm_lock = node_modules / ".package-lock.json"

    def run() -> dict:
        return run_through_launcher(tmp_path, RESOLVING, env, cli)

    assert run() == {"inside": "one", "outside": "one"}
    (kept,) = (tmp_path / "cache").glob("resolutions-*.json")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # Pi's package now points elsewhere, without npm; the extension gets a package of its
    # own. Pi's resolution is kept, the extension's was not.
    package(node_modules / "inside", "two.js")
    package(extension.parent / "node_modules" / "inside", "two.js")
    assert run() == {"inside": "one", "outside": "two"}
    # npm rewrites .package-lock.json whenever it changes node_modules.
    npm_lock.write_text('{"changed": true}')
    assert run() == {"inside": "two", "outside": "two"}


def test_a_cache_directory_that_cannot_be_used_only_costs_time(tmp_path):
    cli, extension = pi_like_install(tmp_path)
    env = {"OUTSIDE_URL": extension.as_uri()}
    not_a_directory = tmp_path / "cache-is-a-file"
    not_a_directory.write_text("")
    seen = run_through_launcher(tmp_path, RESOLVING, env, cli, cache=not_a_directory)
    assert seen == {"inside": "one", "outside": "one"}
