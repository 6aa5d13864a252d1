/**
 * Canonical JSON (reference client-protocol §1.3): sorted keys, no whitespace, `undefined`
 * dropped, non-finite numbers refused. Every frame sent to the host uses it.
 */

function normalize(value: unknown): unknown {
	if (value === null || typeof value === "string" || typeof value === "boolean") return value;
	if (typeof value === "number") {
		if (!Number.isFinite(value)) throw new Error("Canonical JSON cannot hold a non-finite number");
		return Object.is(value, -0) ? 0 : value;
	}
	if (Array.isArray(value)) return value.map((item) => (item === undefined ? null : normalize(item)));
	if (typeof value === "object") {
		const source = value as Record<string, unknown>;
		const sorted: Record<string, unknown> = {};
		for (const key of Object.keys(source).sort()) {
			if (source[key] !== undefined) sorted[key] = normalize(source[key]);
		}
		return sorted;
	}
	throw new Error(`Canonical JSON cannot hold a ${typeof value}`);
}

export function canonicalJson(value: unknown): string {
	return JSON.stringify(normalize(value));
}
