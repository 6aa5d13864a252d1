/**
 * The session's one sender of workflow messages and its reporter of model turns
 * (reference client-protocol §3.8 and §4.8).
 *
 * The host serves the session view; this class decides, from that view and Pi's own state,
 * when to show the next message (only while Pi is idle with no pending input, never when the
 * branch already holds it), reports the branch (every custom entry carrying a workflow
 * message id), and reports each Pi agent run that works on a message as a workflow turn.
 * Only an `active` receipt grants a turn; reports are flushed in order, after a branch
 * report in the current coordinator epoch, and a report that did not reach the host is
 * repeated with the same payload once the session is connected again.
 */

import { randomUUID } from "node:crypto";
import type { AgentEndEvent, SessionEntry } from "@mariozechner/pi-coding-agent";
import { type PiMessage, piMessageFor, startsTurn, type WorkflowMessage } from "./content.js";
import { isObject, type PendingInteraction, type RunStatus } from "./envelope.js";
import { type HostResponse, HostUnavailable, isOk, RequestRefused } from "./host-link.js";

const RECEIPT_SCHEMA = "pi-workflows.workflow-turn-report-receipt.v1";
const TURN_SCHEMA = "pi-workflows.workflow-turn.v1";
const REPLACED = "Workflow session coordinator was replaced";

/** The host's open workflow turn of the session (reference client-protocol §4.8). */
export interface OpenWorkflowTurn {
	workflowTurnId: string;
	workflowMessageId: string;
	runId: string;
	state: string;
}

/** The session view the host sends (`session_snapshot`), as `viewProblem` checks it. */
export interface SessionView {
	sessionId: string;
	run: RunStatus | null;
	pendingInteractions: PendingInteraction[];
	workflowMessages: WorkflowMessage[];
	nextWorkflowMessageId: string | null;
	openWorkflowMessageId: string | null;
	openWorkflowTurn: OpenWorkflowTurn | null;
	coordinatorEpoch: string | null;
	coordinatorActive: boolean;
	branchReportRequired: boolean;
}

/** What the coordinator needs from Pi. */
export interface PiSide {
	isIdle(): boolean;
	hasPendingMessages(): boolean;
	branch(): SessionEntry[];
	sendMessage(message: PiMessage, options: { triggerTurn: boolean }): void;
}

/** What the coordinator needs from the host connection. */
export interface HostSide {
	request(operation: string, payload: Record<string, unknown>, options?: { runId?: string }): Promise<HostResponse>;
}

interface TurnEnd {
	stopReason: "completed" | "aborted" | "error";
	responseSessionEntryId: string | null;
	/** For an `error` stop: `The model P/M failed: …` (the host fails the step with it). */
	error?: string;
}

interface LocalTurn {
	workflowTurnId: string;
	workflowMessageId: string;
	runId: string;
	kind: string;
	startReported: boolean;
	dropped: boolean;
	end?: TurnEnd;
}

/** What Pi hands `agent_end`: the run's messages. */
type AgentMessages = AgentEndEvent["messages"];

/** A turn report's receipt (reference §4.8), as `validateReceipt` checks it. */
export interface TurnReceipt {
	schema: string;
	ownership: "active" | "settled" | "absent";
	turn: Record<string, unknown> | null;
}

/** A report the host refused for good (not a lost connection): the turn is dropped. */
class TurnRefused extends Error {}

/** The workflow message id a custom message entry of the branch carries, if any. */
function workflowMessageIdOf(entry: SessionEntry): unknown {
	return entry.type === "custom_message" && isObject(entry.details) ? entry.details.workflowMessageId : undefined;
}

export class MessageCoordinator {
	private view: SessionView | null = null;
	private epoch: string | null = null;
	private branchReportedEpoch: string | null = null;
	private lastBranchKey = "";
	private readonly queued = new Set<string>();
	// The message just sent with `triggerTurn`: the next Pi run works on it (kept whole, so a
	// view lost to a reconnect in between cannot unbind it).
	private awaitingTurnMessage: WorkflowMessage | null = null;
	private readonly closedTurnMessages = new Set<string>();
	private readonly settledTurnIds = new Set<string>();
	private turns: LocalTurn[] = [];
	private current: LocalTurn | null = null;
	private running = false;
	private again = false;
	private fenced = false;
	// Runs a view showed unfinished: their failure is announced once.
	private readonly liveRuns = new Set<string>();

	constructor(
		private readonly sessionId: string,
		private readonly pi: PiSide,
		private readonly host: HostSide,
		private readonly onFenced: () => void,
		private readonly onProblem: (text: string) => void,
		private readonly onVacant: () => void = () => {},
	) {}

	/** A new connection became the session's coordinator with `epoch`. */
	connected(epoch: string): void {
		this.epoch = epoch;
		this.view = null;
		this.branchReportedEpoch = null;
		this.lastBranchKey = "";
	}

	disconnected(): void {
		this.epoch = null;
		this.view = null;
		this.branchReportedEpoch = null;
	}

	get isFenced(): boolean {
		return this.fenced;
	}

	get latestView(): SessionView | null {
		return this.view;
	}

	updateView(view: SessionView): void {
		if (this.fenced) {
			// Fenced, this client only watches: no coordinator at all means the Pi process
			// that took the session over is gone, and this one may take it back.
			this.view = view;
			if (view.coordinatorEpoch === null) this.onVacant();
			return;
		}
		if (this.epoch && view.coordinatorEpoch && view.coordinatorEpoch !== this.epoch && !view.coordinatorActive) {
			this.fence();
			return;
		}
		this.view = view;
		this.noticeFailedRun(view.run);
		this.schedule();
	}

	/** A run this session saw going that failed gets one notice saying why (the model may
	 * not be able to explain it: its provider may be what failed). */
	private noticeFailedRun(run: RunStatus | null): void {
		if (!run?.runId) return;
		if (run.status !== "failed") {
			this.liveRuns.add(run.runId);
			return;
		}
		if (!this.liveRuns.delete(run.runId)) return;
		this.onProblem(`the workflow run ${run.workflowName ?? ""} ${run.runId} failed: ${run.error ?? "no reason given"}`);
	}

	/** Coordinate again after a fence (the session had no coordinator left). */
	unfence(): void {
		this.fenced = false;
		this.view = null;
	}

	/** The turn Pi is running now, if the host granted (or may still grant) it a message. */
	currentTurn(): { workflowMessageId: string; startReported: boolean; dropped: boolean } | null {
		return this.current;
	}

	schedule(): void {
		void this.synchronize();
	}

	/** One pass at a time; a request made while a pass runs makes it run once more. */
	async synchronize(): Promise<void> {
		if (this.running) {
			this.again = true;
			return;
		}
		this.running = true;
		try {
			do {
				this.again = false;
				await this.pass();
			} while (this.again && !this.fenced);
		} catch (error) {
			if (!(error instanceof HostUnavailable)) this.onProblem(String((error as Error).message ?? error));
		} finally {
			this.running = false;
		}
	}

	// --- Pi events --------------------------------------------------------------------------

	agentStarted(): void {
		const candidate = this.candidate();
		const message = this.awaitingTurnMessage ?? (candidate ? this.message(candidate) : undefined);
		this.awaitingTurnMessage = null;
		if (!message) {
			this.current = null;
			return;
		}
		this.current = {
			workflowTurnId: `workflow-turn-${randomUUID()}`,
			workflowMessageId: message.workflowMessageId,
			runId: message.runId,
			kind: message.kind,
			startReported: false,
			dropped: false,
		};
		this.turns.push(this.current);
		this.schedule();
	}

	/** A Pi run ended; true when it was a workflow turn the model failed (a provider or
	 * model error), which ends the step: Pi's own retry of it must not run. */
	agentEnded(messages: AgentMessages): boolean {
		const turn = this.current;
		this.current = null;
		if (!turn || turn.dropped) return false;
		const stopReason = stopReasonOf(messages);
		turn.end = {
			stopReason,
			responseSessionEntryId: this.responseEntry(turn.workflowMessageId),
			error: stopReason === "error" ? modelFailure(messages) : undefined,
		};
		this.schedule();
		return stopReason === "error";
	}

	/** The first message a fresh Pi run may work on: the open one, else one we just sent. */
	private candidate(): string | null {
		const view = this.view;
		if (!view) return null;
		const open = view.openWorkflowMessageId;
		if (open && !this.closedTurnMessages.has(open)) {
			const message = this.message(open);
			if (message && startsTurn(message.kind)) return open;
		}
		for (const id of this.queued) {
			const message = this.message(id);
			if (message && message.status === "pending" && startsTurn(message.kind)) return id;
		}
		return null;
	}

	/** The entry of the model's last reply after the message's own entry, if any. */
	private responseEntry(workflowMessageId: string): string | null {
		const branch = this.pi.branch();
		for (let index = branch.length - 1; index >= 0; index--) {
			const entry = branch[index];
			if (workflowMessageIdOf(entry) === workflowMessageId) return null;
			if (entry.type === "message" && entry.message.role === "assistant") return entry.id;
		}
		return null;
	}

	// --- the synchronize pass (reference §3.8) ---------------------------------------------

	private active(): boolean {
		const view = this.view;
		return Boolean(
			!this.fenced && view && this.epoch && view.coordinatorActive && view.coordinatorEpoch === this.epoch,
		);
	}

	private message(id: string): WorkflowMessage | undefined {
		return this.view?.workflowMessages.find((message) => message.workflowMessageId === id);
	}

	private async pass(): Promise<void> {
		const view = this.view;
		if (!this.active() || !view) return;
		this.resumeOpenTurn(view);
		const entries = this.branchEntries();
		const key = JSON.stringify(entries);
		const unrecorded = entries.some((entry) => this.message(entry.workflowMessageId)?.status !== "sent");
		if (
			this.branchReportedEpoch !== this.epoch ||
			view.branchReportRequired ||
			(unrecorded && key !== this.lastBranchKey)
		) {
			await this.reportBranch(entries, key);
		}
		await this.flushTurns();
		await this.sendNext();
	}

	/** Pi is busy with a turn the host still shows open and we know nothing of: adopt it. */
	private resumeOpenTurn(view: SessionView): void {
		const open = view.openWorkflowTurn;
		if (this.current || this.pi.isIdle() || !open || open.state !== "started") return;
		if (this.settledTurnIds.has(open.workflowTurnId) || this.closedTurnMessages.has(open.workflowMessageId)) return;
		if (this.turns.some((turn) => turn.workflowTurnId === open.workflowTurnId)) return;
		const message = this.message(open.workflowMessageId);
		if (!message) return;
		this.current = {
			workflowTurnId: open.workflowTurnId,
			workflowMessageId: open.workflowMessageId,
			runId: open.runId,
			kind: message.kind,
			startReported: true,
			dropped: false,
		};
		this.turns.push(this.current);
	}

	private branchEntries(): Array<{ workflowMessageId: string; sessionEntryId: string }> {
		const entries: Array<{ workflowMessageId: string; sessionEntryId: string }> = [];
		const seen = new Set<string>();
		for (const entry of this.pi.branch()) {
			const id = workflowMessageIdOf(entry);
			if (typeof id !== "string" || seen.has(id) || !this.message(id)) continue;
			seen.add(id);
			entries.push({ workflowMessageId: id, sessionEntryId: entry.id });
		}
		return entries;
	}

	private async reportBranch(
		entries: Array<{ workflowMessageId: string; sessionEntryId: string }>,
		key: string,
	): Promise<void> {
		const epoch = this.epoch;
		// A turn this client still has to report keeps the session busy: an idle report would
		// make the host end it as lost.
		const idle = this.pi.isIdle() && !this.current && this.turns.length === 0;
		const response = await this.host.request("workflowMessage.reportBranch", {
			targetSessionId: this.sessionId,
			coordinatorEpoch: epoch,
			entries,
			isIdle: idle,
			hasPendingMessages: this.pi.hasPendingMessages(),
		});
		this.checkFence(response);
		if (!isOk(response)) throw new RequestRefused(response);
		if (this.epoch === epoch) {
			this.branchReportedEpoch = epoch;
			this.lastBranchKey = key;
		}
	}

	private async flushTurns(): Promise<void> {
		if (!this.active() || this.branchReportedEpoch !== this.epoch) return;
		for (const turn of [...this.turns]) {
			try {
				if (!turn.startReported) {
					if (this.message(turn.workflowMessageId)?.status !== "sent") return;
					const receipt = await this.reportTurn(turn, "started");
					if (receipt.ownership !== "active") {
						this.drop(turn);
						continue;
					}
					turn.startReported = true;
				}
				if (!turn.end) return; // still running: later turns wait behind it
				await this.reportTurn(turn, "ended");
				this.finish(turn);
			} catch (error) {
				if (!(error instanceof TurnRefused)) throw error;
				this.drop(turn);
				this.onProblem(error.message);
			}
		}
	}

	private async reportTurn(turn: LocalTurn, state: "started" | "ended"): Promise<TurnReceipt> {
		const payload: Record<string, unknown> = {
			state,
			workflowTurnId: turn.workflowTurnId,
			workflowMessageId: turn.workflowMessageId,
			runId: turn.runId,
			targetSessionId: this.sessionId,
			coordinatorEpoch: this.epoch,
		};
		if (state === "ended" && turn.end) {
			payload.stopReason = turn.end.stopReason;
			payload.responseSessionEntryId = turn.end.responseSessionEntryId;
			payload.error = turn.end.error;
		}
		const response = await this.host.request("workflowTurn.report", payload, { runId: turn.runId });
		this.checkFence(response);
		if (!isOk(response)) {
			throw new TurnRefused(`The workflow host refused a turn report: ${response.error ?? response.outcome}`);
		}
		return validateReceipt(response.receipt, turn, this.sessionId, state);
	}

	private drop(turn: LocalTurn): void {
		turn.dropped = true;
		this.turns = this.turns.filter((candidate) => candidate !== turn);
	}

	/** The host settled the turn: forget it and do not bind later Pi runs to its message. */
	private finish(turn: LocalTurn): void {
		this.drop(turn);
		this.settledTurnIds.add(turn.workflowTurnId);
		if (turn.kind === "terminal" || turn.kind === "followUp") this.closedTurnMessages.add(turn.workflowMessageId);
		const view = this.view;
		if (view && view.openWorkflowMessageId === turn.workflowMessageId) {
			this.view = { ...view, openWorkflowMessageId: null, openWorkflowTurn: null };
		}
	}

	private async sendNext(): Promise<void> {
		const view = this.view;
		if (!this.active() || !view) return;
		const next = view.nextWorkflowMessageId;
		if (!next || this.queued.has(next)) return;
		const message = this.message(next);
		if (message?.status !== "pending") return;
		if (!this.pi.isIdle() || this.pi.hasPendingMessages()) return;
		this.queued.add(next);
		if (this.branchHas(next)) {
			const entries = this.branchEntries();
			await this.reportBranch(entries, JSON.stringify(entries));
			return;
		}
		// Re-check with no await in between: the same view, still ours, Pi still idle.
		if (
			this.view !== view ||
			!this.active() ||
			view.nextWorkflowMessageId !== next ||
			!this.pi.isIdle() ||
			this.pi.hasPendingMessages() ||
			this.branchHas(next)
		) {
			this.queued.delete(next);
			return;
		}
		const { message: piMessage, options } = piMessageFor(message);
		if (options.triggerTurn) this.awaitingTurnMessage = message;
		this.pi.sendMessage(piMessage, options);
		if (!options.triggerTurn) {
			// Shown without a turn: the entry is in the branch already.
			const entries = this.branchEntries();
			await this.reportBranch(entries, JSON.stringify(entries));
		}
		// A turn-starting message reaches the branch when Pi records it; a later pass reports it.
	}

	private branchHas(id: string): boolean {
		return this.pi.branch().some((entry) => workflowMessageIdOf(entry) === id);
	}

	private checkFence(response: HostResponse): void {
		if (isOk(response) || !response.error?.includes(REPLACED)) return;
		this.fence();
		throw new HostUnavailable(REPLACED);
	}

	/** Another Pi process took the session over: this one sends and reports nothing until
	 * that process is gone (`onVacant`). */
	private fence(): void {
		if (this.fenced) return;
		this.fenced = true;
		this.onFenced();
	}
}

const FAILURE_CHARS = 400;

/** `The model P/M failed: <its error, on one line>`, from the run's last assistant message. */
function modelFailure(messages: AgentMessages): string {
	const last = lastAssistant(messages);
	const name = last ? `${last.provider}/${last.model}` : "of this Pi session";
	const detail = String(last?.errorMessage || "no error message").replace(/\s+/g, " ").trim();
	const cut = detail.length > FAILURE_CHARS ? `${detail.slice(0, FAILURE_CHARS - 1)}…` : detail;
	return `The model ${name} failed: ${cut}`;
}

type AssistantMessage = Extract<AgentMessages[number], { role: "assistant" }>;

function lastAssistant(messages: AgentMessages): AssistantMessage | undefined {
	return messages.findLast((message): message is AssistantMessage => message?.role === "assistant");
}

function stopReasonOf(messages: AgentMessages): TurnEnd["stopReason"] {
	const last = lastAssistant(messages);
	if (!last) return "error";
	if (last.stopReason === "aborted") return "aborted";
	if (last.stopReason === "error") return "error";
	return "completed";
}

/** The receipt contract of reference §4.8; anything else is a host this client cannot trust. */
export function validateReceipt(
	receipt: unknown,
	turn: Pick<LocalTurn, "workflowTurnId" | "workflowMessageId" | "runId">,
	sessionId: string,
	state: "started" | "ended",
): TurnReceipt {
	const fail = (why: string): never => {
		throw new TurnRefused(`The workflow host sent an invalid turn receipt: ${why}`);
	};
	if (!isObject(receipt) || receipt.schema !== RECEIPT_SCHEMA) return fail("wrong schema");
	const ownership = receipt.ownership;
	if (ownership !== "active" && ownership !== "settled" && ownership !== "absent") {
		return fail(`unknown ownership ${ownership}`);
	}
	if (ownership === "absent") {
		if (receipt.turn !== null) fail("an absent receipt carries a turn");
		return { schema: RECEIPT_SCHEMA, ownership, turn: null };
	}
	const saved = receipt.turn;
	if (!isObject(saved) || saved.schema !== TURN_SCHEMA) return fail("the turn has the wrong schema");
	if (
		saved.workflowTurnId !== turn.workflowTurnId ||
		saved.workflowMessageId !== turn.workflowMessageId ||
		saved.runId !== turn.runId ||
		saved.targetSessionId !== sessionId
	) {
		fail("the turn belongs to another message");
	}
	if (ownership === "active" && saved.state !== "started") fail("an active turn is not started");
	if (ownership === "settled" && saved.state !== "ended") fail("a settled turn has not ended");
	if (state === "ended" && ownership !== "settled") fail("an end report was not settled");
	return { schema: RECEIPT_SCHEMA, ownership, turn: saved };
}
