/**
 * Starts Pi's CLI for headless agent steps: `node pi.mjs CACHE_DIR PI_CLI_JS PI_ARGS...`.
 *
 * The `pi` executor starts pi through this file when `npm ci` installed a Node of its own
 * next to Pi (piw_pi/node.py). Loading Pi's modules is most of pi's start-up; three things
 * here make it cheaper without changing what pi does:
 *
 * - Node's compile cache keeps V8's compiled code between starts, in CACHE_DIR (a private
 *   directory the executor made; "" runs without either cache).
 * - The resolutions of module specifiers inside the node_modules that holds Pi (which
 *   file `import "x"` from that file means) are kept in CACHE_DIR as well, so a start does
 *   not search the file system for them again. They are dropped when npm changes that
 *   node_modules (its .package-lock.json), or with another Node; resolutions from or to
 *   anywhere else (a user's extension, a project) are never kept.
 * - Two modules that Pi imports at start but a headless pi does not use are loaded when
 *   first used instead: cli-highlight, with highlight.js and its ~190 languages (Pi
 *   highlights code only when its TUI draws tool output), and jiti's Babel bundle (jiti
 *   transpiles an extension with it only when its own cache of the transpiled file
 *   misses). For the one Pi module that imports each, it is replaced by a module whose
 *   exports call the real one, `require`d on the first call. Another Pi version that
 *   imports them from elsewhere simply gets the real modules at start.
 *
 * process.argv is put back as if pi had been started directly, and nothing is added to the
 * environment that pi's tools pass on to the commands they run.
 */
import { createHash } from "node:crypto";
import { readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import nodeModule from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

/** [the importing module's path ends with, the specifier it imports, its import names]. */
const LOADED_ON_FIRST_USE = [
	["/pi-coding-agent/dist/modes/interactive/theme/theme.js", "cli-highlight", ["highlight", "supportsLanguage"]],
	["/jiti/lib/jiti-static.mjs", "../dist/babel.cjs", ["default"]],
];
const STUB_SCHEME = "piw-on-first-use:";

/** An ES module whose `names` call the same exports of the CommonJS module at `path`. */
function stubSource(path, names) {
	const lines = [
		'import { createRequire } from "node:module";',
		`const path = ${JSON.stringify(path)};`,
		"let real;",
		"const load = () => (real ??= createRequire(path)(path));",
	];
	for (const name of names) {
		lines.push(
			name === "default"
				? "export default function (...args) { return load()(...args); }"
				: `export function ${name}(...args) { return load().${name}(...args); }`,
		);
	}
	return lines.join("\n");
}

/**
 * Resolutions inside one node_modules, kept in a file: `get` answers from it, `set` adds to
 * it, `save` writes it when something was added. Valid while the node_modules is unchanged
 * (npm rewrites its .package-lock.json on every install) and for this Node only.
 */
class KeptResolutions {
	constructor(cacheDir, nodeModules) {
		this.root = pathToFileURL(nodeModules).href;
		// One file per node_modules, so two installs sharing a cache do not undo each other.
		const install = createHash("sha256").update(this.root).digest("hex").slice(0, 16);
		this.path = `${cacheDir}/resolutions-${process.version}-${install}.json`;
		const lock = statSync(`${nodeModules}.package-lock.json`, { throwIfNoEntry: false });
		this.stamp = lock ? `${lock.mtimeMs} ${lock.size}` : undefined;
		this.entries = new Map();
		this.added = false;
		try {
			const kept = JSON.parse(readFileSync(this.path, "utf8"));
			if (kept.stamp === this.stamp) {
				this.entries = new Map(kept.entries);
			}
		} catch {
			// None kept yet, or unreadable: resolve everything afresh.
		}
	}

	key(specifier, context) {
		if (this.stamp === undefined || !context.parentURL?.startsWith(this.root)) {
			return undefined;
		}
		return `${context.parentURL} ${specifier} ${context.conditions?.join(",")}`;
	}

	get(key) {
		return this.entries.get(key);
	}

	set(key, resolved) {
		if (resolved.url.startsWith(this.root)) {
			this.entries.set(key, { url: resolved.url, format: resolved.format ?? undefined });
			this.added = true;
		}
	}

	save() {
		if (!this.added) {
			return;
		}
		this.added = false;
		const temporary = `${this.path}.${process.pid}`;
		const text = JSON.stringify({ stamp: this.stamp, entries: [...this.entries] });
		try {
			writeFileSync(temporary, text, { mode: 0o600 });
			renameSync(temporary, this.path);
		} catch {
			// Kept resolutions only save time: pi runs on without them.
		}
	}
}

function registerHooks(kept) {
	nodeModule.registerHooks({
		resolve(specifier, context, nextResolve) {
			const entry = LOADED_ON_FIRST_USE.find(
				([importer, name]) => name === specifier && context.parentURL?.endsWith(importer),
			);
			if (entry !== undefined) {
				const names = encodeURIComponent(entry[2].join(","));
				const real = nextResolve(specifier, context).url;
				return { url: `${STUB_SCHEME}${names}:${real}`, format: "module", shortCircuit: true };
			}
			const key = kept?.key(specifier, context);
			const known = key === undefined ? undefined : kept.get(key);
			if (known !== undefined) {
				return { ...known, shortCircuit: true };
			}
			const resolved = nextResolve(specifier, context);
			if (key !== undefined) {
				kept.set(key, resolved);
			}
			return resolved;
		},
		load(url, context, nextLoad) {
			if (!url.startsWith(STUB_SCHEME)) {
				return nextLoad(url, context);
			}
			const rest = url.slice(STUB_SCHEME.length);
			const split = rest.indexOf(":");
			const names = decodeURIComponent(rest.slice(0, split)).split(",");
			const source = stubSource(fileURLToPath(rest.slice(split + 1)), names);
			return { format: "module", source, shortCircuit: true };
		},
	});
}

const [cacheDir, cli] = process.argv.slice(2, 4);
process.argv.splice(1, 3, cli);
const nodeModules = cli.slice(0, cli.lastIndexOf("/node_modules/") + "/node_modules/".length);
let kept;
if (cacheDir) {
	nodeModule.enableCompileCache(cacheDir);
	if (nodeModules.endsWith("/node_modules/")) {
		kept = new KeptResolutions(cacheDir, nodeModules);
		// Modules Pi loads later (its provider's SDK, on the first prompt) are kept too.
		process.once("exit", () => kept.save());
	}
}
if (typeof nodeModule.registerHooks === "function") {
	registerHooks(kept);
}
await import(pathToFileURL(cli).href);
// Pi's modules are loaded and pi is serving now. Node also writes the compile cache when it
// exits normally (pi ends on SIGTERM that way), but a pi that is killed outright would
// leave nothing, so write what is known so far at once.
if (cacheDir) {
	nodeModule.flushCompileCache();
	kept?.save();
}
