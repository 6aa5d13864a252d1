/**
 * What the model's `workflow` tool and the person's `/workflow` command can do in this
 * session. Both act only on the session's own runs; the difference is authority: the model
 * may answer an ordinary checkpoint but never a protected human decision, which only the
 * person (the `session` decision channel) can answer.
 */

import { type DecisionSummary, isObject, type PendingInteraction, type ReceiptOf, valueAt } from "./envelope.js";
import { isOk, type RequestOptions, RequestRefused, runCli } from "./host-link.js";
import type { WorkflowSession } from "./session.js";

export const MODEL_DECISION_REFUSAL = "Protected human decisions cannot be answered by the workflow tool";
const REJECTED_OUTPUT = "The workflow rejected this output:";
const SUBMIT_TIMEOUT_MS = 330_000;
const TURN_START_WAIT_MS = 10_000;

export interface StepTarget {
	requestId?: string;
	step?: string;
	attempt?: string;
}

/** A typed answer: JSON when it parses, else the text itself. */
export function parseAnswer(text: string): unknown {
	try {
		return JSON.parse(text);
	} catch {
		return text;
	}
}

/**
 * A person's answer as a decision response (reference decisions §3.3): `{choice, input?}`
 * as is, `{answer: "key"}` as that choice, a bare string (a choice key) as the choice.
 */
export function decisionResponse(
	answer: unknown,
	decision: Pick<DecisionSummary, "choices">,
): { choice: string; input?: unknown } {
	const given = isObject(answer) ? answer : null;
	const choice = typeof answer === "string" ? answer.trim() : (given?.choice ?? given?.answer);
	if (typeof choice !== "string" || !choice) {
		const keys = Object.keys(decision.choices ?? {}).join(", ");
		throw new Error(
			`A human decision answer requires a choice: answer with one of ${keys} (e.g. /workflow answer ${keys.split(", ")[0]}), or {"choice": "…", "input": …}.`,
		);
	}
	return given?.input !== undefined ? { choice, input: given.input } : { choice };
}

function sleep(ms: number): Promise<void> {
	return new Promise((resolve) => setTimeout(resolve, ms));
}

export class WorkflowActions {
	constructor(private readonly current: () => WorkflowSession | null) {}

	private session(): WorkflowSession {
		const session = this.current();
		if (!session) throw new Error("This Pi session is not connected to pi-workflows yet.");
		if (session.isFenced) {
			throw new Error("Another Pi process coordinates this workflow session; use that one.");
		}
		return session;
	}

	/** The receipt of `operation`, of the type its envelope check (`Receipts`) guarantees. */
	private async call<Operation extends string>(
		operation: Operation,
		payload: Record<string, unknown>,
		options: RequestOptions = {},
	): Promise<ReceiptOf<Operation>> {
		const response = await this.session().request(operation, payload, options);
		if (!isOk(response)) throw new RequestRefused(response);
		return response.receipt as ReceiptOf<Operation>;
	}

	/** The runs this session has shown messages of, and its current run, oldest first. */
	private async sessionRuns(): Promise<string[]> {
		const view = await this.session().currentView();
		const runs = view.workflowMessages.map((message) => message.runId);
		if (view.run?.runId) runs.push(view.run.runId);
		return runs;
	}

	/** The named run if it is one of this session's, else the session's current (or last) run. */
	private async runOf(runId?: string): Promise<string> {
		const view = await this.session().currentView();
		const runs = await this.sessionRuns();
		if (runId) {
			if (!runs.includes(runId)) throw new Error(`Run ${runId} is not a run of this Pi session.`);
			return runId;
		}
		const current = view.run?.runId ?? runs[runs.length - 1];
		if (!current) throw new Error("This Pi session has no workflow run; start one with /workflow start NAME.");
		return current;
	}

	async listWorkflows(cwd: string): Promise<string> {
		// The CLI's own `workflows --json` listing.
		const found = JSON.parse(await runCli(["workflows", "--project", cwd, "--json"], cwd)) as Array<{
			name: string;
			error?: string | null;
		}>;
		if (found.length === 0) return "No workflows found.";
		return found
			.map((entry) => (entry.error ? `${entry.name}  BROKEN: ${entry.error}` : `${entry.name}`))
			.join("\n");
	}

	async start(workflow: string | undefined, input: unknown, cwd: string, idempotencyKey?: string) {
		if (!workflow) throw new Error("Name the workflow to start, e.g. /workflow start two-turn.");
		const session = this.session();
		const args = ["pi", "start-payload", workflow, "--project", cwd];
		if (input !== undefined) args.push("--input-json", JSON.stringify(input));
		const payload = JSON.parse(await runCli(args, cwd)) as Record<string, unknown>;
		payload.executionMode = "interactive";
		payload.originSessionId = session.sessionId;
		return await this.call("run.start", payload, { idempotencyKey });
	}

	async status(runId?: string) {
		return await this.call("run.status", {}, { runId: await this.runOf(runId) });
	}

	async control(operation: "run.pause" | "run.resume" | "run.cancel", runId?: string): Promise<unknown> {
		return await this.call(operation, {}, { runId: await this.runOf(runId) });
	}

	/** The newest still-pending human decision of this session's runs, if any. */
	private async pendingDecision(): Promise<DecisionSummary | null> {
		const view = await this.session().currentView();
		const ids = new Set(
			view.workflowMessages
				.filter((message) => message.kind === "decision")
				.map((message) => message.details.decisionId),
		);
		if (ids.size === 0) return null;
		const pending = (await this.call("decision.list", { all: false })).filter(
			(decision) => ids.has(decision.decisionId) && decision.status === "pending",
		);
		return pending.length > 0 ? pending[pending.length - 1] : null;
	}

	/** The model answers: checkpoints only. */
	async answerAsModel(input: unknown, runId?: string): Promise<unknown> {
		if (await this.pendingDecision()) throw new Error(MODEL_DECISION_REFUSAL);
		return await this.call("checkpoint.answer", { input }, { runId: await this.runOf(runId) });
	}

	/**
	 * The person answers (`/workflow answer [RUN] VALUE`): the pending decision through the
	 * session channel, else the run's waiting checkpoint. VALUE is JSON or plain text; RUN,
	 * when the first word names a run of this session, picks that run's checkpoint.
	 */
	async answerAsPerson(raw: string): Promise<unknown> {
		const [first = "", ...rest] = raw.trim().split(/\s+/);
		const runs = await this.sessionRuns();
		const runId = rest.length > 0 && runs.includes(first) ? first : undefined;
		const value = runId ? raw.trim().slice(first.length).trim() : raw.trim();
		const answer = parseAnswer(value);
		const decision = await this.pendingDecision();
		if (!decision) {
			return await this.call("checkpoint.answer", { input: answer }, { runId: await this.runOf(runId) });
		}
		const { choice, input } = decisionResponse(answer, decision);
		const payload: Record<string, unknown> = {
			decisionId: decision.decisionId,
			choice,
			channel: "session",
			sessionId: this.session().sessionId,
		};
		if (input !== undefined) payload.input = input;
		return await this.call("decision.answer", payload);
	}

	private async step(target: StepTarget): Promise<PendingInteraction> {
		const session = this.session();
		const view = await session.currentView();
		const steps = view.pendingInteractions.filter((item) => item.kind !== "decision");
		let matches = steps;
		if (target.requestId) matches = steps.filter((item) => item.requestId === target.requestId);
		else if (target.step) {
			matches = steps.filter(
				(item) => item.step === target.step && (!target.attempt || item.attempt === target.attempt),
			);
		} else if (steps.length > 1) {
			const turn = session.coordinator.currentTurn();
			const message = view.workflowMessages.find((m) => m.workflowMessageId === turn?.workflowMessageId);
			matches = steps.filter((item) => item.requestId === message?.details.requestId);
		}
		if (matches.length !== 1) {
			const open = steps.map((item) => `${item.step} (attempt ${item.attempt})`).join(", ") || "none";
			throw new Error(`No single pending workflow step matches; pending steps: ${open}.`);
		}
		return matches[0];
	}

	/** Submissions follow the turn's start report, so the host sees start, submission, end. */
	private async turnStartSettled(): Promise<void> {
		const coordinator = this.session().coordinator;
		const turn = coordinator.currentTurn();
		const deadline = Date.now() + TURN_START_WAIT_MS;
		while (turn && !turn.startReported && !turn.dropped && Date.now() < deadline) {
			coordinator.schedule();
			await sleep(50);
		}
	}

	async submit(target: StepTarget, output: unknown, toolCallId: string): Promise<unknown> {
		if (output === undefined) throw new Error('submit needs "output": the step\'s result.');
		await this.turnStartSettled();
		const step = await this.step(target);
		const submissionId = `submission-${toolCallId}`;
		try {
			return await this.call(
				"interaction.submit",
				{ requestId: step.requestId, attempt: step.attempt, step: step.step, submissionId, value: output },
				{
					runId: step.runId,
					expectedRevision: step.revision,
					idempotencyKey: submissionId,
					timeoutMs: SUBMIT_TIMEOUT_MS,
				},
			);
		} catch (error) {
			// The step's validator refused the output: tell the model what was wrong and what
			// to do, in the words the headless bridge uses.
			if (error instanceof RequestRefused && valueAt(error.response.receipt, "status") === "rejected") {
				throw new Error(`${REJECTED_OUTPUT} ${error.message} Correct the output and submit again.`);
			}
			throw error;
		}
	}

	async update(target: StepTarget, update: unknown, toolCallId: string): Promise<unknown> {
		if (typeof update !== "object" || update === null || Array.isArray(update)) {
			throw new Error('update needs "update": a JSON object such as {"type": "progress", "data": {…}}.');
		}
		const step = await this.step(target);
		return await this.call(
			"interaction.update",
			{ requestId: step.requestId, attempt: step.attempt, step: step.step, value: { update } },
			{ runId: step.runId, expectedRevision: step.revision, idempotencyKey: `update-${toolCallId}` },
		);
	}
}
