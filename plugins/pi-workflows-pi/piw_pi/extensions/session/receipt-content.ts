/**
 * Putting back the values a host answer carried as content references (SPEC §8; the Python
 * client does the same in pi_workflows/client/content.py).
 *
 * A receipt too big for one frame has its largest values replaced by
 * `{"$content": {sha256, bytes}}`; the connection reads each with `content.read` in chunks,
 * checks every chunk's place and the whole value's sha256, and puts the parsed value back.
 * A user object with a `$content` or `$escaped` key of its own arrives wrapped as
 * `{"$escaped": object}` and is unwrapped here, so it is never taken for a reference.
 */

import { createHash } from "node:crypto";
import { HostProtocolError, isObject } from "./envelope.js";

const CONTENT_KEY = "$content";
const ESCAPE_KEY = "$escaped";
// Node's base64 decoder skips what it cannot read; a chunk must be base64 and nothing else.
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Reads one chunk: the `content.read` receipt for (sha256, bytes, offset). */
export type ChunkReader = (sha256: string, bytes: number, offset: number) => Promise<unknown>;

/** Whether `value` holds a content reference or a wrapped user object. */
export function needsDecoding(value: unknown): boolean {
	if (Array.isArray(value)) return value.some(needsDecoding);
	if (!isObject(value)) return false;
	if (CONTENT_KEY in value || ESCAPE_KEY in value) return true;
	return Object.values(value).some(needsDecoding);
}

/** `value` with every reference replaced by the value it stands for, every wrapped object unwrapped. */
export async function materialize(value: unknown, readChunk: ChunkReader): Promise<unknown> {
	if (Array.isArray(value)) {
		const items: unknown[] = [];
		for (const item of value) items.push(await materialize(item, readChunk));
		return items;
	}
	if (!isObject(value)) return value;
	if (CONTENT_KEY in value) return materialize(await readWhole(referenceOf(value), readChunk), readChunk);
	let object = value;
	if (ESCAPE_KEY in value) {
		const inner = value[ESCAPE_KEY];
		if (Object.keys(value).length !== 1 || !isObject(inner)) {
			throw new HostProtocolError("The workflow host sent a malformed escaped value.");
		}
		object = inner;
	}
	const result: Record<string, unknown> = {};
	for (const [key, child] of Object.entries(object)) result[key] = await materialize(child, readChunk);
	return result;
}

function referenceOf(value: Record<string, unknown>): { sha256: string; bytes: number } {
	const reference = value[CONTENT_KEY];
	if (
		Object.keys(value).length !== 1 ||
		!isObject(reference) ||
		Object.keys(reference).sort().join(",") !== "bytes,sha256" ||
		typeof reference.sha256 !== "string" ||
		!Number.isInteger(reference.bytes) ||
		(reference.bytes as number) < 0
	) {
		throw new HostProtocolError("The workflow host sent a malformed content reference.");
	}
	return { sha256: reference.sha256, bytes: reference.bytes as number };
}

async function readWhole(reference: { sha256: string; bytes: number }, readChunk: ChunkReader): Promise<unknown> {
	const { sha256, bytes } = reference;
	const name = `${sha256.slice(0, 16)}…`;
	const chunks: Buffer[] = [];
	let read = 0;
	while (read < bytes) {
		const receipt = await readChunk(sha256, bytes, read);
		const encoded = isObject(receipt) && typeof receipt.chunk === "string" ? receipt.chunk : "";
		const chunk = BASE64.test(encoded) ? Buffer.from(encoded, "base64") : null;
		if (
			chunk === null ||
			chunk.length === 0 ||
			!isObject(receipt) ||
			receipt.sha256 !== sha256 ||
			receipt.offset !== read ||
			receipt.nextOffset !== read + chunk.length
		) {
			throw new HostProtocolError(`A chunk of content ${name} is invalid; repeat the request.`);
		}
		if (read + chunk.length > bytes) {
			throw new HostProtocolError(`Content ${name} does not match its size; repeat the request.`);
		}
		chunks.push(chunk);
		read += chunk.length;
	}
	const data = Buffer.concat(chunks);
	if (createHash("sha256").update(data).digest("hex") !== sha256) {
		throw new HostProtocolError(`Content ${name} does not match its sha256; repeat the request.`);
	}
	try {
		return JSON.parse(data.toString("utf8"));
	} catch {
		throw new HostProtocolError(`Content ${name} is not valid JSON.`);
	}
}
