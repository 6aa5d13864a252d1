/**
 * The pi-workflows bridge: loaded by `pi --mode rpc -e bridge.ts` for headless agent steps.
 *
 * It registers the model-facing `workflow` tool with two actions, `update` and `submit`, and
 * forwards every call to the pi-workflows worker that started this `pi` over the Unix socket
 * named by PI_WORKFLOWS_BRIDGE_SOCKET (one JSON object per line each way). The worker runs
 * the workflow's validation: an accepted submit ends the agent run (`terminate: true`), a
 * rejected one comes back to the model as the tool's error so it can correct itself.
 *
 * The socket and pi's stdin tie this process to the worker: when the worker goes away (it
 * died or was killed), pi shuts itself down — SIGTERM first, so pi ends the commands its
 * tools started, and SIGKILL after 3 s — so no `pi` outlives its step.
 */
import { readdirSync, readFileSync } from "node:fs";
import { createConnection, type Socket } from "node:net";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";

const SOCKET_ENV = "PI_WORKFLOWS_BRIDGE_SOCKET";
const KILL_GRACE_MS = 3000;

type WorkerReply = { id: number; ok: boolean; text?: string; error?: string; terminate?: boolean };

/** One connection to the worker; requests are answered in any order, matched by id. */
class WorkerLink {
	private nextId = 1;
	private buffer = "";
	private pending = new Map<number, (reply: WorkerReply) => void>();
	private closedByUs = false;

	constructor(private readonly socket: Socket) {
		socket.setEncoding("utf8");
		socket.on("data", (chunk: string) => this.receive(chunk));
		socket.on("close", () => this.lost());
		socket.on("error", () => {
			// "close" follows and ends pi.
		});
	}

	static connect(path: string): Promise<WorkerLink> {
		return new Promise((resolve, reject) => {
			const socket = createConnection(path);
			socket.once("connect", () => resolve(new WorkerLink(socket)));
			socket.once("error", reject);
		});
	}

	request(message: Record<string, unknown>): Promise<WorkerReply> {
		const id = this.nextId++;
		return new Promise((resolve) => {
			this.pending.set(id, resolve);
			this.socket.write(`${JSON.stringify({ ...message, id })}\n`);
		});
	}

	close(): void {
		this.closedByUs = true;
		this.socket.end();
	}

	private receive(chunk: string): void {
		this.buffer += chunk;
		for (let end = this.buffer.indexOf("\n"); end !== -1; end = this.buffer.indexOf("\n")) {
			const line = this.buffer.slice(0, end);
			this.buffer = this.buffer.slice(end + 1);
			if (!line.trim()) continue;
			const reply = JSON.parse(line) as WorkerReply;
			const resolve = this.pending.get(reply.id);
			this.pending.delete(reply.id);
			resolve?.(reply);
		}
	}

	private lost(): void {
		for (const resolve of this.pending.values()) {
			resolve({ id: 0, ok: false, error: "The pi-workflows worker is gone; this step has ended." });
		}
		this.pending.clear();
		if (!this.closedByUs) endPi();
	}
}

let ending = false;

/**
 * The worker is gone: end the commands pi's tools started (each runs in a process group of
 * its own, which pi's end-of-input shutdown leaves alone), then pi itself — SIGTERM, and
 * SIGKILL if that takes over 3 s.
 */
function endPi(): void {
	if (ending) return;
	ending = true;
	for (const child of childProcessIds()) {
		for (const target of [-child, child]) {
			try {
				process.kill(target, "SIGKILL");
			} catch {
				// already gone, or not a group leader
			}
		}
	}
	setTimeout(() => process.kill(process.pid, "SIGKILL"), KILL_GRACE_MS);
	process.kill(process.pid, "SIGTERM");
}

/** The pids whose parent is this process, from /proc (Linux). */
function childProcessIds(): number[] {
	const children: number[] = [];
	let entries: string[] = [];
	try {
		entries = readdirSync("/proc");
	} catch {
		return children;
	}
	for (const entry of entries) {
		if (!/^\d+$/.test(entry)) continue;
		try {
			const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
			// "pid (comm) state ppid …": comm may hold spaces and parentheses.
			const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
			if (parent === process.pid) children.push(Number(entry));
		} catch {
			// the process ended while we looked
		}
	}
	return children;
}

const WorkflowParameters = Type.Object(
	{
		action: Type.Unsafe<"update" | "submit">({
			type: "string",
			enum: ["update", "submit"],
			description: "`submit` completes the step with `output`; `update` publishes progress.",
		}),
		step: Type.String({ description: "The step id from the step contract." }),
		attempt: Type.String({ description: "The attempt id from the step contract." }),
		output: Type.Optional(
			Type.Unknown({ description: "submit: the step's result, as the contract describes it." }),
		),
		update: Type.Optional(
			Type.Object(
				{
					type: Type.String({ description: "What kind of update, e.g. progress." }),
					key: Type.String({ description: "A stable key; a later update replaces it." }),
					data: Type.Object({}, { additionalProperties: true }),
				},
				{ additionalProperties: false, description: "update: the non-completing update." },
			),
		),
	},
	{ additionalProperties: false },
);

export default async function bridge(pi: ExtensionAPI): Promise<void> {
	const socketPath = process.env[SOCKET_ENV];
	const link = socketPath ? await WorkerLink.connect(socketPath) : undefined;
	if (link) {
		// pi's own end-of-input handling exits without ending its tools' commands; this
		// listener runs first (extensions load before RPC mode listens) and ends them too.
		process.stdin.once("end", endPi);
	}
	pi.on("session_shutdown", () => link?.close());

	pi.registerTool({
		name: "workflow",
		label: "Workflow",
		description:
			"Complete or report on the current pi-workflows step. " +
			'`{"action":"submit","step":…,"attempt":…,"output":…}` completes the step; ' +
			'`{"action":"update","step":…,"attempt":…,"update":{"type":…,"key":…,"data":{…}}}` ' +
			"publishes progress without completing it.",
		promptSnippet: "Complete the current pi-workflows step (submit) or report progress (update)",
		promptGuidelines: [
			"Finish a pi-workflows step only by calling the workflow tool with action submit; if it reports a validation error, fix the output and submit again.",
		],
		parameters: WorkflowParameters,
		async execute(toolCallId, params) {
			if (!link) {
				throw new Error(
					`The workflow tool works only inside a pi-workflows step (${SOCKET_ENV} is not set).`,
				);
			}
			const reply = await link.request({ type: params.action, toolCallId, args: params });
			if (!reply.ok) {
				throw new Error(reply.error ?? "The workflow step refused this call.");
			}
			return {
				content: [{ type: "text", text: reply.text ?? "ok" }],
				details: {},
				terminate: reply.terminate === true,
			};
		},
	});
}
