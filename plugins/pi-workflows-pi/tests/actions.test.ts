/** A person's answer to a human decision, as the decision response the host takes. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { decisionResponse, parseAnswer } from "../piw_pi/extensions/session/actions.js";

const decision = { choices: { ship: { label: "Ship it" }, hold: {} } };

describe("decisionResponse", () => {
	test("takes a choice key, {answer}, or {choice, input}", () => {
		assert.deepEqual(decisionResponse(parseAnswer("ship"), decision), { choice: "ship" });
		assert.deepEqual(decisionResponse(parseAnswer('{"answer": "hold"}'), decision), { choice: "hold" });
		assert.deepEqual(decisionResponse(parseAnswer('{"choice": "ship", "input": {"note": "go"}}'), decision), {
			choice: "ship",
			input: { note: "go" },
		});
	});

	test("refuses an answer without a choice, naming the choices", () => {
		assert.throws(
			() => decisionResponse(parseAnswer('{"note": "go"}'), decision),
			/^Error: A human decision answer requires a choice: answer with one of ship, hold \(e\.g\. \/workflow answer ship\)/,
		);
		assert.throws(() => decisionResponse(parseAnswer("[1]"), decision), /requires a choice/);
	});
});
