/**
 * The socket side of a workflow session: finding the host through the pi-workflows CLI,
 * one client-protocol connection (newline-delimited canonical JSON, SPEC §8), and the
 * request/response and event plumbing on top of it.
 */

import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import net from "node:net";
import { canonicalJson } from "./canonical.js";
import { checkResponse, HostProtocolError, type HostResponse, isObject } from "./envelope.js";
import { materialize, needsDecoding } from "./receipt-content.js";

export type { HostResponse } from "./envelope.js";

export const CLIENT_SCHEMA = "pi-workflows.client.v1";
const MAX_FRAME_BYTES = 1024 * 1024;
const CONNECT_TIMEOUT_MS = 5_000;
const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/** How long one request waits for the host's answer: `PI_WORKFLOWS_REQUEST_TIMEOUT_MS`, else 30 s. */
function requestTimeoutMs(): number {
	const value = Number(process.env.PI_WORKFLOWS_REQUEST_TIMEOUT_MS);
	return Number.isInteger(value) && value > 0 ? value : DEFAULT_REQUEST_TIMEOUT_MS;
}
const CLI_TIMEOUT_MS = 60_000;

export interface RequestOptions {
	runId?: string;
	expectedRevision?: number;
	idempotencyKey?: string;
	timeoutMs?: number;
}

/** The host cannot be reached, or the connection broke before it answered. */
export class HostUnavailable extends Error {}

/**
 * The host would not take this connection: its `refused` greeting (too many connections)
 * or a greeting from another pi-workflows version than the CLI's. Worth retrying later:
 * connections free up, and `pi-workflows host stop` replaces a host of another version.
 */
export class HostRefused extends HostUnavailable {}

/** The host answered, but not with `accepted` or `adopted`. */
export class RequestRefused extends Error {
	constructor(readonly response: HostResponse) {
		super(response.error || `The workflow host answered ${response.outcome}.`);
	}
}

export function isOk(response: HostResponse): boolean {
	return response.outcome === "accepted" || response.outcome === "adopted";
}

/** `PI_WORKFLOWS_CLI` (words split on spaces, e.g. "python -m pi_workflows"), default `pi-workflows`. */
function cliArgv(): string[] {
	const words = (process.env.PI_WORKFLOWS_CLI || "pi-workflows").trim().split(/\s+/);
	return words.filter((word) => word.length > 0);
}

// What Pi puts into its own environment for what it runs (`PI_CODING_AGENT=true`). The CLI
// may start the host, which is nobody's child: it takes its settings from its own
// environment and `<config>/settings.toml`, never from the Pi process that happened to
// start it (so its workers and their commands are not told they run inside Pi).
const PI_OWN_ENVIRONMENT = ["PI_CODING_AGENT"];

function cliEnvironment(): NodeJS.ProcessEnv {
	const env = { ...process.env };
	for (const name of PI_OWN_ENVIRONMENT) delete env[name];
	return env;
}

/** Run the pi-workflows CLI; resolves with stdout, rejects with its last error line. */
export function runCli(args: string[], cwd: string): Promise<string> {
	const [command, ...prefix] = cliArgv();
	return new Promise((resolve, reject) => {
		execFile(
			command,
			[...prefix, ...args],
			{ cwd, timeout: CLI_TIMEOUT_MS, maxBuffer: 16 * MAX_FRAME_BYTES, env: cliEnvironment() },
			(error, stdout, stderr) => {
				if (error) {
					const lines = String(stderr || error.message)
						.split("\n")
						.map((line) => line.trim())
						.filter((line) => line.length > 0);
					reject(new Error(lines[lines.length - 1] || `${command} failed`));
					return;
				}
				resolve(String(stdout));
			},
		);
	});
}

export interface HostAddress {
	socketPath: string;
	/** The pi-workflows version of the host, as the CLI (which checks it is its own) saw it. */
	packageVersion: string;
}

/** The socket of this home's host; the CLI starts a host when none runs. */
export async function locateHost(cwd: string): Promise<HostAddress> {
	const found = JSON.parse(await runCli(["pi", "socket", "--json"], cwd));
	if (typeof found?.socketPath !== "string" || typeof found?.packageVersion !== "string") {
		throw new Error("pi-workflows did not name a host socket");
	}
	return { socketPath: found.socketPath, packageVersion: found.packageVersion };
}

/** An event frame of the host (SPEC §8): `payload` is checked by whoever reads it. */
export interface HostEvent {
	type: "event";
	event?: unknown;
	subscriptionId?: unknown;
	payload?: unknown;
}

/** Why the host's first frame does not open a usable connection, or null when it does. */
function refusalOf(first: unknown, expectedVersion: string): HostUnavailable | null {
	if (isObject(first) && first.type === "refused") {
		const reason = typeof first.error === "string" && first.error ? first.error : "no reason given";
		return new HostRefused(`the workflow host refused the connection: ${reason.slice(0, 300)}`);
	}
	if (!isObject(first) || first.type !== "hello") return new HostUnavailable("The workflow host did not greet this session.");
	if (first.packageVersion !== expectedVersion) {
		return new HostRefused(
			`the workflow host runs pi-workflows ${String(first.packageVersion).slice(0, 40)}, ` +
				`the CLI is ${expectedVersion}; stop it with 'pi-workflows host stop'`,
		);
	}
	return null;
}

interface Pending {
	operation: string;
	resolve: (response: HostResponse) => void;
	reject: (error: Error) => void;
	timer: NodeJS.Timeout;
}

export class HostConnection {
	readonly clientId = `client-${randomUUID()}`;
	onEvent: (event: HostEvent) => void = () => {};
	onClose: () => void = () => {};
	/** An event handler failed: the connection goes on, the session says so once. */
	onEventError: (error: Error) => void = () => {};
	private buffer = Buffer.alloc(0);
	private pending = new Map<string, Pending>();
	private closed = false;

	private constructor(private readonly socket: net.Socket) {}

	/** Connect and wait for the host's hello (HostRefused for a refusal or another version). */
	static open(address: HostAddress): Promise<HostConnection> {
		return new Promise((resolve, reject) => {
			const socket = net.createConnection(address.socketPath);
			const connection = new HostConnection(socket);
			let greeted = false;
			const timer = setTimeout(() => {
				socket.destroy();
				reject(new HostUnavailable("The workflow host did not greet this session in time."));
			}, CONNECT_TIMEOUT_MS);
			socket.on("error", (error) => {
				clearTimeout(timer);
				if (!greeted) reject(new HostUnavailable(`No workflow host answers: ${error.message}`));
			});
			socket.on("close", () => connection.shutDown());
			socket.on("data", (chunk: Buffer) => {
				for (const message of connection.frames(chunk)) {
					if (!greeted) {
						clearTimeout(timer);
						const refusal = refusalOf(message, address.packageVersion);
						if (refusal) {
							socket.destroy();
							reject(refusal);
							return;
						}
						greeted = true;
						resolve(connection);
						continue;
					}
					connection.dispatch(message);
				}
			});
		});
	}

	get isOpen(): boolean {
		return !this.closed;
	}

	/** The whole frames received so far; a line that is not JSON ends the connection. */
	private frames(chunk: Buffer): unknown[] {
		this.buffer = Buffer.concat([this.buffer, chunk]);
		const messages: unknown[] = [];
		let newline = this.buffer.indexOf(0x0a);
		while (newline !== -1) {
			const line = this.buffer.subarray(0, newline).toString("utf8");
			this.buffer = this.buffer.subarray(newline + 1);
			if (line.trim().length > 0) {
				try {
					messages.push(JSON.parse(line));
				} catch {
					this.socket.destroy();
					return messages;
				}
			}
			newline = this.buffer.indexOf(0x0a);
		}
		if (this.buffer.length > MAX_FRAME_BYTES) this.socket.destroy();
		return messages;
	}

	private dispatch(message: unknown): void {
		if (!isObject(message)) return;
		if (message.type === "response") {
			if (typeof message.requestId !== "string") {
				// A response no request can claim: the stream cannot be trusted any more.
				this.socket.destroy();
				return;
			}
			const waiter = this.pending.get(message.requestId);
			if (waiter) {
				this.pending.delete(message.requestId);
				clearTimeout(waiter.timer);
				void this.settle(message, waiter);
			}
		} else if (message.type === "event") {
			try {
				this.onEvent(message as unknown as HostEvent);
			} catch (error) {
				this.onEventError(error as Error);
			}
		}
	}

	/** Resolve `waiter` with the checked response, its content references read back first. */
	private async settle(message: Record<string, unknown>, waiter: Pending): Promise<void> {
		try {
			let response = message;
			if (needsDecoding(message.receipt)) {
				response = { ...message, receipt: await materialize(message.receipt, (...at) => this.readChunk(...at)) };
			}
			waiter.resolve(checkResponse(response, waiter.operation));
		} catch (error) {
			waiter.reject(error as Error);
		}
	}

	private async readChunk(sha256: string, bytes: number, offset: number): Promise<unknown> {
		const response = await this.request("content.read", { sha256, bytes, offset });
		if (!isOk(response)) {
			throw new HostProtocolError(`The workflow host could not send content ${sha256.slice(0, 16)}…: ${response.error ?? response.outcome}`);
		}
		return response.receipt;
	}

	request(operation: string, payload: Record<string, unknown>, options: RequestOptions = {}): Promise<HostResponse> {
		if (this.closed) return Promise.reject(new HostUnavailable("The workflow host connection is closed."));
		const requestId = `request-${randomUUID()}`;
		const frame: Record<string, unknown> = {
			schema: CLIENT_SCHEMA,
			type: "request",
			requestId,
			clientId: this.clientId,
			operation,
			idempotencyKey: options.idempotencyKey ?? requestId,
			payload,
			runId: options.runId,
			expectedRevision: options.expectedRevision,
		};
		const line = `${canonicalJson(frame)}\n`;
		if (Buffer.byteLength(line) > MAX_FRAME_BYTES) {
			return Promise.reject(new Error(`The ${operation} request is larger than 1 MiB.`));
		}
		return new Promise((resolve, reject) => {
			const timer = setTimeout(() => {
				this.pending.delete(requestId);
				reject(new HostUnavailable(`The workflow host did not answer ${operation} in time.`));
			}, options.timeoutMs ?? requestTimeoutMs());
			this.pending.set(requestId, { operation, resolve, reject, timer });
			this.socket.write(line);
		});
	}

	close(): void {
		this.socket.destroy();
		this.shutDown();
	}

	private shutDown(): void {
		if (this.closed) return;
		this.closed = true;
		for (const [requestId, waiter] of this.pending) {
			clearTimeout(waiter.timer);
			waiter.reject(new HostUnavailable("Lost the connection to the workflow host."));
			this.pending.delete(requestId);
		}
		this.onClose();
	}
}
