/** Shared shapes for the extension's unit tests. */

import type { SessionView } from "../piw_pi/extensions/session/coordinator.js";
import type { WorkflowMessage } from "../piw_pi/extensions/session/content.js";

export function workflowMessage(overrides: Partial<WorkflowMessage> = {}): WorkflowMessage {
	return {
		workflowMessageId: "message-1",
		runId: "run-1",
		kind: "step",
		status: "pending",
		order: 1,
		content: "Write the plan.",
		details: { step: "plan", attempt: "attempt-1", requestId: "request-1" },
		sessionEntryId: null,
		...overrides,
	};
}

export function sessionView(overrides: Partial<SessionView> = {}): SessionView {
	return {
		sessionId: "session-1",
		run: null,
		pendingInteractions: [],
		workflowMessages: [],
		nextWorkflowMessageId: null,
		openWorkflowMessageId: null,
		openWorkflowTurn: null,
		coordinatorEpoch: "epoch-1",
		coordinatorActive: true,
		branchReportRequired: false,
		...overrides,
	};
}

/** Wait until `ready()` holds, polling each event-loop turn; fails after `ms`. */
export async function until(ready: () => boolean, what: string, ms = 5_000): Promise<void> {
	const deadline = Date.now() + ms;
	while (!ready()) {
		if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
		await new Promise((resolve) => setTimeout(resolve, 5));
	}
}
