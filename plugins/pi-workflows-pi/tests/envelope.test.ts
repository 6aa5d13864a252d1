/** The envelope checks: what the host sends is checked before anything reads it. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { canonicalJson } from "../piw_pi/extensions/session/canonical.js";
import { checkResponse, HostProtocolError, viewProblem } from "../piw_pi/extensions/session/envelope.js";
import { sessionView } from "./fixtures.js";

describe("checkResponse", () => {
	test("passes a response with a well-formed receipt on as it is", () => {
		const message = {
			type: "response",
			requestId: "request-1",
			outcome: "accepted",
			receipt: { runId: "run-1", status: "running", workflowName: "two-turn" },
		};
		assert.deepEqual(checkResponse(message, "run.status"), message);
	});

	test("refuses an unknown outcome, naming the operation", () => {
		assert.throws(
			() => checkResponse({ requestId: "request-1", outcome: "maybe" }, "run.status"),
			(error: unknown) =>
				error instanceof HostProtocolError &&
				error.message === 'The workflow host sent an invalid answer to run.status: unknown outcome "maybe".',
		);
	});

	test("refuses a receipt missing a field the extension reads", () => {
		assert.throws(
			() => checkResponse({ requestId: "r", outcome: "accepted", receipt: { runId: "run-1", status: "x" } }, "run.status"),
			/receipt\.workflowName is missing/,
		);
		assert.throws(
			() => checkResponse({ requestId: "r", outcome: "accepted", receipt: [{ decisionId: "d", status: 3 }] }, "decision.list"),
			/receipt\[0\]\.status is not text/,
		);
	});

	test("does not read the receipt of a refusal or of an operation it does not check", () => {
		assert.doesNotThrow(() => checkResponse({ requestId: "r", outcome: "conflict", error: "stale" }, "run.status"));
		assert.doesNotThrow(() => checkResponse({ requestId: "r", outcome: "accepted", receipt: 7 }, "run.pause"));
	});

	test("refuses an error that is not text and a revision that is not an integer", () => {
		assert.throws(() => checkResponse({ requestId: "r", outcome: "conflict", error: {} }, "run.pause"), /error is not text/);
		assert.throws(() => checkResponse({ requestId: "r", outcome: "accepted", revision: 1.5 }, "run.pause"), /revision/);
	});
});

describe("viewProblem", () => {
	test("accepts a well-formed session view", () => {
		assert.equal(viewProblem(sessionView()), null);
	});

	test("names the first thing wrong with a view", () => {
		assert.equal(viewProblem(null), "it is not an object");
		assert.equal(viewProblem({ ...sessionView(), workflowMessages: {} }), "view.workflowMessages is not a list");
		assert.equal(viewProblem({ ...sessionView(), coordinatorActive: "yes" }), "view.coordinatorActive is not true or false");
		const message = { workflowMessageId: "m1", runId: "run-1", kind: "step", status: "pending", content: "x" };
		assert.equal(
			viewProblem({ ...sessionView(), workflowMessages: [message] }),
			"workflowMessages[0].details is not an object",
		);
		assert.equal(
			viewProblem({ ...sessionView(), pendingInteractions: [{ kind: "step" }] }),
			"pendingInteractions[0] has no requestId or kind",
		);
	});
});

describe("canonicalJson", () => {
	test("sorts keys, drops undefined and refuses non-finite numbers", () => {
		assert.equal(canonicalJson({ b: 1, a: { d: undefined, c: [undefined, -0] } }), '{"a":{"c":[null,0]},"b":1}');
		assert.throws(() => canonicalJson({ x: Number.NaN }), /non-finite/);
	});
});
