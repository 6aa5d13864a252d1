/**
 * Starts Pi's CLI for headless agent steps: `node pi.mjs CACHE_DIR PI_CLI_JS PI_ARGS...`.
 *
 * The `pi` executor starts pi through this file when `npm ci` installed a Node of its own
 * next to Pi (piw_pi/node.py). Loading Pi's modules is most of pi's start-up; two things
 * here make it cheaper without changing what pi does:
 *
 * - Node's compile cache keeps V8's compiled code between starts, in CACHE_DIR (a private
 *   directory the executor made; "" runs without a cache).
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

function loadOnFirstUse() {
	nodeModule.registerHooks({
		resolve(specifier, context, nextResolve) {
			const entry = LOADED_ON_FIRST_USE.find(
				([importer, name]) => name === specifier && context.parentURL?.endsWith(importer),
			);
			const resolved = nextResolve(specifier, context);
			if (entry === undefined) {
				return resolved;
			}
			const names = encodeURIComponent(entry[2].join(","));
			return { url: `${STUB_SCHEME}${names}:${resolved.url}`, format: "module", shortCircuit: true };
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
if (cacheDir) {
	nodeModule.enableCompileCache(cacheDir);
}
if (typeof nodeModule.registerHooks === "function") {
	loadOnFirstUse();
}
await import(pathToFileURL(cli).href);
// Pi's modules are loaded and pi is serving now. Node also writes the cache when it exits
// normally (pi ends on SIGTERM that way), but a pi that is killed outright would leave
// nothing, so write what is compiled so far at once.
if (cacheDir) {
	nodeModule.flushCompileCache();
}
