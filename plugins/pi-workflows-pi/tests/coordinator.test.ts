/**
 * The message coordinator with Pi and the host played in memory: what it sends to Pi, when,
 * and what it reports to the host (reference client-protocol §3.8, §4.8).
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AgentEndEvent, SessionEntry } from "@mariozechner/pi-coding-agent";
import { type PiMessage, piMessageFor, type WorkflowMessage } from "../piw_pi/extensions/session/content.js";
import {
	type HostSide,
	MessageCoordinator,
	type PiSide,
	type SessionView,
} from "../piw_pi/extensions/session/coordinator.js";
import type { HostResponse } from "../piw_pi/extensions/session/host-link.js";
import { sessionView, until, workflowMessage } from "./fixtures.js";

const SESSION = "session-1";
const EPOCH = "epoch-1";

/** Pi: idle or busy, a branch that records each message it is sent. */
class FakePi implements PiSide {
	idle = true;
	entries: SessionEntry[] = [];
	sent: Array<{ message: PiMessage; triggerTurn: boolean }> = [];
	isIdle(): boolean {
		return this.idle;
	}
	hasPendingMessages(): boolean {
		return false;
	}
	branch(): SessionEntry[] {
		return this.entries;
	}
	sendMessage(message: PiMessage, options: { triggerTurn: boolean }): void {
		this.sent.push({ message, triggerTurn: options.triggerTurn });
		this.entries.push({
			type: "custom_message",
			id: `entry-${this.entries.length + 1}`,
			parentId: null,
			timestamp: "",
			customType: message.customType,
			content: message.content,
			display: message.display,
			details: message.details,
		} as SessionEntry);
	}
	reply(model = "model-x", stopReason = "stop", errorMessage?: string): AgentEndEvent["messages"] {
		const assistant = {
			role: "assistant",
			provider: "provider-y",
			model,
			stopReason,
			errorMessage,
			content: [],
			timestamp: 0,
		} as unknown as AgentEndEvent["messages"][number];
		this.entries.push({ type: "message", id: `entry-${this.entries.length + 1}`, message: assistant } as SessionEntry);
		return [assistant];
	}
}

/** The host: records each request and answers it as a cooperative host would. */
class FakeHost implements HostSide {
	requests: Array<{ operation: string; payload: Record<string, unknown> }> = [];
	async request(operation: string, payload: Record<string, unknown>): Promise<HostResponse> {
		this.requests.push({ operation, payload });
		if (operation !== "workflowTurn.report") return { requestId: "r", outcome: "accepted", receipt: {} };
		const ended = payload.state === "ended";
		return {
			requestId: "r",
			outcome: "accepted",
			receipt: {
				schema: "pi-workflows.workflow-turn-report-receipt.v1",
				ownership: ended ? "settled" : "active",
				turn: {
					schema: "pi-workflows.workflow-turn.v1",
					workflowTurnId: payload.workflowTurnId,
					workflowMessageId: payload.workflowMessageId,
					runId: payload.runId,
					targetSessionId: SESSION,
					state: ended ? "ended" : "started",
				},
			},
		};
	}
	operations(): string[] {
		return this.requests.map((request) => request.operation);
	}
	turnReports(): Array<Record<string, unknown>> {
		return this.requests.filter((request) => request.operation === "workflowTurn.report").map((request) => request.payload);
	}
}

function setUp(): { pi: FakePi; host: FakeHost; coordinator: MessageCoordinator; fenced: () => number; problems: string[] } {
	const pi = new FakePi();
	const host = new FakeHost();
	let fences = 0;
	const problems: string[] = [];
	const coordinator = new MessageCoordinator(
		SESSION,
		pi,
		host,
		() => fences++,
		(text) => problems.push(text),
	);
	coordinator.connected(EPOCH);
	return { pi, host, coordinator, fenced: () => fences, problems };
}

function viewWith(message: WorkflowMessage, overrides: Partial<SessionView> = {}): SessionView {
	return sessionView({ workflowMessages: [message], nextWorkflowMessageId: message.workflowMessageId, ...overrides });
}

describe("MessageCoordinator", () => {
	test("an idle Pi is sent the next message once, after a branch report of its epoch", async () => {
		const { pi, host, coordinator } = setUp();
		const notification = workflowMessage({ kind: "notification", details: { nodeId: "build" } });
		coordinator.updateView(viewWith(notification));
		await until(() => host.requests.length === 2, "the branch report after sending");
		assert.deepEqual(host.requests[0], {
			operation: "workflowMessage.reportBranch",
			payload: { targetSessionId: SESSION, coordinatorEpoch: EPOCH, entries: [], isIdle: true, hasPendingMessages: false },
		});
		assert.equal(pi.sent.length, 1);
		assert.equal(pi.sent[0].message.customType, "pi-workflows-notification");
		assert.deepEqual(host.requests[1].payload.entries, [{ workflowMessageId: "message-1", sessionEntryId: "entry-1" }]);

		coordinator.updateView(viewWith(notification));
		await coordinator.synchronize();
		assert.equal(pi.sent.length, 1, "a message is sent once");
	});

	test("a message the branch already holds is reported, never sent again", async () => {
		const { pi, host, coordinator } = setUp();
		const notification = workflowMessage({ kind: "notification" });
		pi.sendMessage(piMessageFor(notification).message, { triggerTurn: false });
		pi.sent = [];
		coordinator.updateView(viewWith(notification));
		await until(() => host.requests.length === 1, "the branch report");
		await coordinator.synchronize();
		assert.deepEqual(pi.sent, []);
		assert.deepEqual(host.requests[0].payload.entries, [{ workflowMessageId: "message-1", sessionEntryId: "entry-1" }]);
	});

	test("a busy Pi is sent nothing until it is idle", async () => {
		const { pi, host, coordinator } = setUp();
		pi.idle = false;
		coordinator.updateView(viewWith(workflowMessage({ kind: "notification" })));
		await until(() => host.requests.length === 1, "the branch report");
		assert.equal(host.requests[0].payload.isIdle, false);
		await coordinator.synchronize();
		assert.equal(pi.sent.length, 0);
		pi.idle = true;
		await coordinator.synchronize();
		assert.equal(pi.sent.length, 1);
	});

	test("the Pi run a step message starts is reported as a workflow turn: started, then ended with the reply", async () => {
		const { pi, host, coordinator } = setUp();
		const step = workflowMessage();
		coordinator.updateView(viewWith(step));
		await until(() => pi.sent.length === 1, "the step message");
		assert.equal(pi.sent[0].triggerTurn, true);
		pi.idle = false;
		coordinator.agentStarted();
		// The host records the message as sent once the branch shows it.
		coordinator.updateView(viewWith({ ...step, status: "sent" }, { nextWorkflowMessageId: null }));
		await until(() => host.turnReports().length === 1, "the start report");
		assert.equal(coordinator.currentTurn()?.startReported, true);
		const ended = coordinator.agentEnded(pi.reply());
		assert.equal(ended, false, "a completed turn leaves Pi's own handling alone");
		pi.idle = true;
		await until(() => host.turnReports().length === 2, "the end report");
		const [started, end] = host.turnReports();
		assert.equal(started.state, "started");
		assert.equal(started.workflowMessageId, "message-1");
		assert.equal(end.workflowTurnId, started.workflowTurnId);
		assert.deepEqual(
			{ state: end.state, stopReason: end.stopReason, responseSessionEntryId: end.responseSessionEntryId },
			{ state: "ended", stopReason: "completed", responseSessionEntryId: "entry-2" },
		);
	});

	test("a turn the model fails ends as an error naming the model, and Pi's retry is to be cancelled", async () => {
		const { pi, host, coordinator } = setUp();
		const step = workflowMessage();
		coordinator.updateView(viewWith(step));
		await until(() => pi.sent.length === 1, "the step message");
		coordinator.agentStarted();
		coordinator.updateView(viewWith({ ...step, status: "sent" }, { nextWorkflowMessageId: null }));
		await until(() => host.turnReports().length === 1, "the start report");
		assert.equal(coordinator.agentEnded(pi.reply("model-x", "error", "401\n  key refused")), true);
		await until(() => host.turnReports().length === 2, "the end report");
		const end = host.turnReports()[1];
		assert.equal(end.stopReason, "error");
		assert.equal(end.error, "The model provider-y/model-x failed: 401 key refused");
	});

	test("a view naming another coordinator fences this one: it sends and reports nothing more", async () => {
		const { pi, host, coordinator, fenced } = setUp();
		coordinator.updateView(
			viewWith(workflowMessage({ kind: "notification" }), { coordinatorEpoch: "epoch-2", coordinatorActive: false }),
		);
		await coordinator.synchronize();
		assert.equal(fenced(), 1);
		assert.equal(coordinator.isFenced, true);
		assert.deepEqual(host.requests, []);
		assert.deepEqual(pi.sent, []);
	});

	test("a run the session saw going that fails gets one notice with its reason", async () => {
		const { coordinator, problems } = setUp();
		const run = { runId: "run-1", workflowName: "two-turn", status: "running" };
		coordinator.updateView(sessionView({ run }));
		coordinator.updateView(sessionView({ run: { ...run, status: "failed", error: "modelFailed" } }));
		coordinator.updateView(sessionView({ run: { ...run, status: "failed", error: "modelFailed" } }));
		assert.deepEqual(problems, ["the workflow run two-turn run-1 failed: modelFailed"]);
	});

	test("a turn receipt for another message drops the turn with one problem", async () => {
		const { pi, host, coordinator, problems } = setUp();
		host.request = async (operation, payload) => {
			host.requests.push({ operation, payload });
			if (operation !== "workflowTurn.report") return { requestId: "r", outcome: "accepted", receipt: {} };
			const receipt = {
				schema: "pi-workflows.workflow-turn-report-receipt.v1",
				ownership: "active",
				turn: { schema: "pi-workflows.workflow-turn.v1", workflowTurnId: "someone-else", state: "started" },
			};
			return { requestId: "r", outcome: "accepted", receipt };
		};
		const step = workflowMessage();
		coordinator.updateView(viewWith(step));
		await until(() => pi.sent.length === 1, "the step message");
		coordinator.agentStarted();
		coordinator.updateView(viewWith({ ...step, status: "sent" }, { nextWorkflowMessageId: null }));
		await until(() => problems.length === 1, "the problem");
		assert.equal(problems[0], "The workflow host sent an invalid turn receipt: the turn belongs to another message");
		assert.equal(coordinator.currentTurn()?.dropped, true);
	});
});
