/**
 * What the host sends, checked before anything reads it (SPEC §8; reference client-protocol
 * §1.4): a response envelope, the receipt of each operation this extension reads fields of,
 * and the session view. A frame that fails a check is a `HostProtocolError` with one line
 * saying what was wrong: the request it answers fails with it (the person or the model sees
 * it), a bad view is ignored with a notice; nothing the host sends can crash Pi.
 */

export const OUTCOMES = ["accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"];

/** The host sent something this client cannot use. */
export class HostProtocolError extends Error {}

/** A run as `run.status` and the session view show it (its text fields are checked). */
export interface RunStatus {
	runId: string;
	status: string;
	workflowName: string;
	paused?: boolean;
	statusDetail?: string | null;
	error?: string | null;
}

/** One entry of `decision.list`. */
export interface DecisionSummary {
	decisionId: string;
	status: string;
	choices?: Record<string, unknown>;
}

/** A step request (or decision) of the session view's `pendingInteractions`. */
export interface PendingInteraction {
	requestId: string;
	kind: string;
	runId?: string;
	step?: string;
	attempt?: string;
	revision?: number;
}

/** The receipts whose fields this extension reads, by operation: what `RECEIPTS` checks. */
export interface Receipts {
	"run.start": { runId: string };
	"run.status": RunStatus;
	"decision.list": DecisionSummary[];
}

/** The receipt type of `operation`: checked for the operations of `Receipts`, else unknown. */
export type ReceiptOf<Operation extends string> = Operation extends keyof Receipts ? Receipts[Operation] : unknown;

type Check = (value: unknown) => string | null;

export const isObject = (value: unknown): value is Record<string, unknown> =>
	typeof value === "object" && value !== null && !Array.isArray(value);
/** The value at `path` inside nested objects, or undefined where one is missing. */
export function valueAt(value: unknown, ...path: string[]): unknown {
	let found = value;
	for (const key of path) {
		if (!isObject(found)) return undefined;
		found = found[key];
	}
	return found;
}

const isText = (value: unknown): value is string => typeof value === "string" && value.length > 0;

/** Why `value[key]` is not text (or null when `nullable`), or null when it is. */
function text(value: Record<string, unknown>, key: string, where: string, nullable = false): string | null {
	const field = value[key];
	if (isText(field) || (nullable && field === null)) return null;
	return `${where}.${key} is ${field === undefined ? "missing" : "not text"}`;
}

function first(...problems: Array<string | null>): string | null {
	return problems.find((problem) => problem !== null) ?? null;
}

function objectWith(keys: string[]): Check {
	return (receipt) =>
		isObject(receipt) ? first(...keys.map((key) => text(receipt, key, "receipt"))) : "the receipt is not an object";
}

const runStatus = objectWith(["runId", "status", "workflowName"]);

/** Receipts whose fields the extension reads, by operation; others are passed on as they are. */
const RECEIPTS: Record<keyof Receipts, Check> = {
	"run.start": objectWith(["runId"]),
	"run.status": runStatus,
	"decision.list": (receipt) => {
		if (!Array.isArray(receipt)) return "the receipt is not a list";
		for (const [index, decision] of receipt.entries()) {
			if (!isObject(decision)) return `receipt[${index}] is not an object`;
			const problem = first(
				text(decision, "decisionId", `receipt[${index}]`),
				text(decision, "status", `receipt[${index}]`),
			);
			if (problem) return problem;
			if (decision.choices !== undefined && !isObject(decision.choices)) return `receipt[${index}].choices is not an object`;
		}
		return null;
	},
};

/** A response envelope (SPEC §8): its receipt is checked only for the operations of `Receipts`. */
export interface HostResponse {
	requestId: string;
	outcome: string;
	receipt?: unknown;
	error?: string;
	revision?: number;
}

/** The response to `operation`, checked; HostProtocolError says what is wrong with it. */
export function checkResponse(message: Record<string, unknown>, operation: string): HostResponse {
	const fail = (why: string): never => {
		throw new HostProtocolError(`The workflow host sent an invalid answer to ${operation}: ${why}.`);
	};
	if (typeof message.outcome !== "string" || !OUTCOMES.includes(message.outcome)) fail(`unknown outcome ${JSON.stringify(message.outcome)?.slice(0, 40)}`);
	if (message.error !== undefined && typeof message.error !== "string") fail("its error is not text");
	if (message.revision !== undefined && !Number.isInteger(message.revision)) fail("its revision is not an integer");
	const ok = message.outcome === "accepted" || message.outcome === "adopted";
	const check: Check | undefined = RECEIPTS[operation as keyof Receipts];
	if (ok && check) {
		const problem = check(message.receipt);
		if (problem) fail(problem);
	}
	return message as unknown as HostResponse;
}

const VIEW_LISTS = ["pendingInteractions", "workflowMessages"];
const VIEW_IDS = ["nextWorkflowMessageId", "openWorkflowMessageId", "coordinatorEpoch"];

function checkMessage(message: unknown, index: number): string | null {
	const where = `workflowMessages[${index}]`;
	if (!isObject(message)) return `${where} is not an object`;
	const problem = first(
		text(message, "workflowMessageId", where),
		text(message, "runId", where),
		text(message, "kind", where),
		text(message, "status", where),
	);
	if (problem) return problem;
	if (typeof message.content !== "string") return `${where}.content is not text`;
	if (!isObject(message.details)) return `${where}.details is not an object`;
	return null;
}

/** Why a session view cannot be used, or null when it can. */
export function viewProblem(view: unknown): string | null {
	if (!isObject(view)) return "it is not an object";
	const problem = text(view, "sessionId", "view");
	if (problem) return problem;
	for (const key of VIEW_LISTS) {
		if (!Array.isArray(view[key])) return `view.${key} is not a list`;
	}
	for (const key of VIEW_IDS) {
		const id = text(view, key, "view", true);
		if (id) return id;
	}
	if (view.run !== null && runStatus(view.run)) return `view.run: ${runStatus(view.run)}`;
	if (view.openWorkflowTurn !== null && !isObject(view.openWorkflowTurn)) return "view.openWorkflowTurn is not an object";
	for (const key of ["coordinatorActive", "branchReportRequired"]) {
		if (typeof view[key] !== "boolean") return `view.${key} is not true or false`;
	}
	for (const [index, message] of (view.workflowMessages as unknown[]).entries()) {
		const bad = checkMessage(message, index);
		if (bad) return bad;
	}
	for (const [index, item] of (view.pendingInteractions as unknown[]).entries()) {
		if (!isObject(item) || !isText(item.requestId) || !isText(item.kind)) {
			return `pendingInteractions[${index}] has no requestId or kind`;
		}
	}
	return null;
}
