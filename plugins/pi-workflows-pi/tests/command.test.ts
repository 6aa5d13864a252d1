/** The action list and the `/workflow` command parser. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
	ACTION_NAMES,
	COMMAND_ACTIONS,
	COMMAND_FORMS,
	completions,
	parseCommand,
} from "../piw_pi/extensions/session/command.js";

describe("the action list", () => {
	test("the tool takes every action, the person's command all but update and submit", () => {
		assert.deepEqual(ACTION_NAMES, ["start", "list", "status", "answer", "update", "submit", "pause", "resume", "cancel"]);
		assert.deepEqual(COMMAND_ACTIONS, ["start", "list", "status", "answer", "pause", "resume", "cancel"]);
	});

	test("the usage line names each command action", () => {
		assert.equal(
			COMMAND_FORMS,
			"/workflow NAME [task text] | start NAME [JSON] | list | status | answer CHOICE|JSON | pause | resume | cancel",
		);
	});

	test("completions are the command actions starting with what was typed", () => {
		assert.deepEqual(completions("s"), [
			{ value: "start", label: "start" },
			{ value: "status", label: "status" },
		]);
		assert.deepEqual(completions("")?.map((item) => item.value), COMMAND_ACTIONS);
		assert.equal(completions("sub"), null, "submit is the model's, not the person's");
	});
});

describe("parseCommand", () => {
	test("no words is the usage", () => {
		assert.deepEqual(parseCommand("   "), { action: "usage" });
	});

	test("a workflow name with text starts it with that task (the reference's form)", () => {
		assert.deepEqual(parseCommand("review fix the login bug"), {
			action: "start",
			workflow: "review",
			input: { task: "fix the login bug" },
		});
		assert.deepEqual(parseCommand("review"), { action: "start", workflow: "review", input: undefined });
	});

	test("start NAME takes JSON, --input-json JSON or a task", () => {
		assert.deepEqual(parseCommand('start review {"n": 2}'), { action: "start", workflow: "review", input: { n: 2 } });
		assert.deepEqual(parseCommand("start review --input-json [1]"), { action: "start", workflow: "review", input: [1] });
		assert.deepEqual(parseCommand("start review tidy up"), {
			action: "start",
			workflow: "review",
			input: { task: "tidy up" },
		});
		assert.deepEqual(parseCommand("start"), { action: "start", workflow: "", input: undefined });
	});

	test("input that looks like JSON but is not is refused with the text", () => {
		assert.throws(() => parseCommand("start review {oops"), /^Error: The input is not valid JSON: \{oops$/);
	});

	test("answer keeps the rest of the line and needs one", () => {
		assert.deepEqual(parseCommand("answer run-1  continue"), { action: "answer", answer: "run-1  continue" });
		assert.throws(() => parseCommand("answer"), /Give the answer/);
	});

	test("the control actions; the model's actions are workflow names to the person", () => {
		assert.deepEqual(parseCommand("cancel"), { action: "cancel" });
		assert.deepEqual(parseCommand("pause"), { action: "pause" });
		assert.deepEqual(parseCommand("submit"), { action: "start", workflow: "submit", input: undefined });
	});
});
