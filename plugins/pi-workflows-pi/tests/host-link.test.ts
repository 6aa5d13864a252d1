/** The host link against a real Unix socket server speaking the client protocol. */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { HostProtocolError } from "../piw_pi/extensions/session/envelope.js";
import {
	CLIENT_SCHEMA,
	HostConnection,
	type HostEvent,
	HostRefused,
	HostUnavailable,
} from "../piw_pi/extensions/session/host-link.js";
import { until } from "./fixtures.js";

const VERSION = "0.1.0";
const directory = mkdtempSync(join(tmpdir(), "piw-host-link-"));
after(() => rmSync(directory, { recursive: true, force: true }));
let sockets = 0;

type Frame = Record<string, unknown>;

/** A host on a fresh socket: greets with `greeting`, then hands each request frame to `answer`. */
async function host(
	answer: (frame: Frame, line: string, socket: net.Socket) => void,
	greeting: Frame = { type: "hello", packageVersion: VERSION },
): Promise<{ socketPath: string; server: net.Server }> {
	const socketPath = join(directory, `host-${sockets++}.sock`);
	const server = net.createServer((socket) => {
		socket.write(`${JSON.stringify(greeting)}\n`);
		let buffer = "";
		socket.setEncoding("utf8");
		socket.on("data", (chunk: string) => {
			buffer += chunk;
			for (let end = buffer.indexOf("\n"); end !== -1; end = buffer.indexOf("\n")) {
				const line = buffer.slice(0, end);
				buffer = buffer.slice(end + 1);
				answer(JSON.parse(line) as Frame, line, socket);
			}
		});
		socket.on("error", () => {});
	});
	await new Promise<void>((resolve) => server.listen(socketPath, resolve));
	after(() => server.close());
	return { socketPath, server };
}

function reply(socket: net.Socket, frame: Frame): void {
	socket.write(`${JSON.stringify(frame)}\n`);
}

async function connect(socketPath: string): Promise<HostConnection> {
	const connection = await HostConnection.open({ socketPath, packageVersion: VERSION });
	after(() => connection.close());
	return connection;
}

describe("HostConnection", () => {
	test("sends one canonical request frame and resolves with the checked response", async () => {
		const lines: string[] = [];
		const { socketPath } = await host((frame, line, socket) => {
			lines.push(line);
			reply(socket, {
				type: "response",
				requestId: frame.requestId,
				outcome: "accepted",
				receipt: { runId: "run-1", status: "running", workflowName: "two-turn" },
			});
		});
		const connection = await connect(socketPath);
		const response = await connection.request("run.status", {}, { runId: "run-1", idempotencyKey: "key-1" });
		assert.deepEqual(response.receipt, { runId: "run-1", status: "running", workflowName: "two-turn" });
		assert.equal(lines.length, 1);
		const sent = JSON.parse(lines[0]) as Frame;
		assert.deepEqual(Object.keys(sent), [...Object.keys(sent)].sort(), "keys are sorted");
		assert.deepEqual(
			{ ...sent, requestId: "?" },
			{
				clientId: connection.clientId,
				idempotencyKey: "key-1",
				operation: "run.status",
				payload: {},
				requestId: "?",
				runId: "run-1",
				schema: CLIENT_SCHEMA,
				type: "request",
			},
		);
	});

	test("a response whose receipt is malformed fails its request with one line", async () => {
		const { socketPath } = await host((frame, _line, socket) => {
			reply(socket, { type: "response", requestId: frame.requestId, outcome: "accepted", receipt: { runId: 5 } });
		});
		const connection = await connect(socketPath);
		await assert.rejects(
			connection.request("run.start", {}),
			(error: unknown) =>
				error instanceof HostProtocolError &&
				error.message === "The workflow host sent an invalid answer to run.start: receipt.runId is not text.",
		);
		assert.ok(connection.isOpen, "one bad answer does not end the connection");
	});

	test("a refused greeting is HostRefused with the host's reason", async () => {
		const { socketPath } = await host(() => {}, { type: "refused", error: "too many connections" });
		await assert.rejects(
			HostConnection.open({ socketPath, packageVersion: VERSION }),
			(error: unknown) =>
				error instanceof HostRefused &&
				error.message === "the workflow host refused the connection: too many connections",
		);
	});

	test("a host of another version is HostRefused, saying how to replace it", async () => {
		const { socketPath } = await host(() => {}, { type: "hello", packageVersion: "9.9.9" });
		await assert.rejects(
			HostConnection.open({ socketPath, packageVersion: VERSION }),
			(error: unknown) => error instanceof HostRefused && /runs pi-workflows 9\.9\.9.*pi-workflows host stop/.test(error.message),
		);
	});

	test("no socket is HostUnavailable", async () => {
		await assert.rejects(
			HostConnection.open({ socketPath: join(directory, "absent.sock"), packageVersion: VERSION }),
			(error: unknown) => error instanceof HostUnavailable && /No workflow host answers/.test(error.message),
		);
	});

	test("events reach onEvent; a failing handler reaches onEventError and the connection goes on", async () => {
		let client: net.Socket | undefined;
		const { socketPath } = await host((frame, _line, socket) => {
			client = socket;
			reply(socket, { type: "response", requestId: frame.requestId, outcome: "accepted", receipt: {} });
		});
		const connection = await connect(socketPath);
		await connection.request("view.session.watch", {});
		const events: HostEvent[] = [];
		const errors: string[] = [];
		connection.onEvent = (event) => {
			if (event.event === "bad") throw new Error("handler broke");
			events.push(event);
		};
		connection.onEventError = (error) => errors.push(error.message);
		assert.ok(client);
		reply(client, { type: "event", event: "bad" });
		reply(client, { type: "event", event: "session_snapshot", payload: { n: 1 } });
		await until(() => events.length === 1, "the second event");
		assert.deepEqual(errors, ["handler broke"]);
		assert.deepEqual(events[0], { type: "event", event: "session_snapshot", payload: { n: 1 } });
		assert.ok(connection.isOpen);
	});

	test("a dropped connection fails the waiting request with HostUnavailable and calls onClose", async () => {
		const { socketPath } = await host((_frame, _line, socket) => socket.destroy());
		const connection = await connect(socketPath);
		let closed = 0;
		connection.onClose = () => closed++;
		await assert.rejects(
			connection.request("run.status", {}),
			(error: unknown) => error instanceof HostUnavailable && error.message === "Lost the connection to the workflow host.",
		);
		assert.equal(closed, 1);
		assert.equal(connection.isOpen, false);
		await assert.rejects(connection.request("run.status", {}), /connection is closed/);
	});

	test("a line that is not JSON ends the connection", async () => {
		const { socketPath } = await host((_frame, _line, socket) => socket.write("{not json\n"));
		const connection = await connect(socketPath);
		await assert.rejects(connection.request("run.status", {}), HostUnavailable);
		assert.equal(connection.isOpen, false);
	});

	test("a host that does not answer in time fails the request, and the connection stays", async () => {
		const { socketPath } = await host(() => {});
		const connection = await connect(socketPath);
		await assert.rejects(
			connection.request("run.status", {}, { timeoutMs: 50 }),
			(error: unknown) => error instanceof HostUnavailable && /did not answer run\.status in time/.test(error.message),
		);
		assert.ok(connection.isOpen);
	});

	test("a request over 1 MiB is refused before it is sent", async () => {
		const lines: string[] = [];
		const { socketPath } = await host((_frame, line) => lines.push(line));
		const connection = await connect(socketPath);
		await assert.rejects(connection.request("run.start", { big: "x".repeat(1024 * 1024) }), /larger than 1 MiB/);
		assert.deepEqual(lines, []);
	});

	/** A host whose run.list receipt holds `big` as a content reference, read in 100-byte chunks. */
	async function hostWithContent(big: unknown, tamper = false): Promise<{ socketPath: string; reads: number[] }> {
		const data = Buffer.from(JSON.stringify(big));
		const sha256 = createHash("sha256").update(data).digest("hex");
		const reads: number[] = [];
		const { socketPath } = await host((frame, _line, socket) => {
			const payload = frame.payload as Frame;
			if (frame.operation === "content.read") {
				const offset = payload.offset as number;
				reads.push(offset);
				const chunk = Buffer.from(data.subarray(offset, offset + 100));
				if (tamper && offset === 0) chunk[0] ^= 1;
				const receipt = { sha256, offset, chunk: chunk.toString("base64"), nextOffset: offset + chunk.length };
				reply(socket, { type: "response", requestId: frame.requestId, outcome: "accepted", receipt });
				return;
			}
			const receipt = {
				runs: [{ runId: "run-1", finalOutput: { $content: { sha256, bytes: data.length } } }],
				// A user value with a "$content" key of its own, wrapped by the host.
				literal: { $escaped: { $content: "just text" } },
			};
			reply(socket, { type: "response", requestId: frame.requestId, outcome: "accepted", receipt });
		});
		return { socketPath, reads };
	}

	test("content references in a receipt are read back in chunks; escaped user values are unwrapped", async () => {
		const big = { text: "y".repeat(450), nested: { $escaped: { $escaped: 1 } } };
		const { socketPath, reads } = await hostWithContent(big);
		const connection = await connect(socketPath);
		const response = await connection.request("run.list", {});
		assert.deepEqual(response.receipt, {
			runs: [{ runId: "run-1", finalOutput: { text: "y".repeat(450), nested: { $escaped: 1 } } }],
			literal: { $content: "just text" },
		});
		assert.deepEqual(reads, [0, 100, 200, 300, 400]);
	});

	test("content that does not match its sha256 fails the request with one line", async () => {
		const { socketPath } = await hostWithContent({ text: "z".repeat(300) }, true);
		const connection = await connect(socketPath);
		await assert.rejects(
			connection.request("run.list", {}),
			(error: unknown) => error instanceof HostProtocolError && /does not match its sha256; repeat the request\.$/.test(error.message),
		);
		assert.ok(connection.isOpen);
	});
});
