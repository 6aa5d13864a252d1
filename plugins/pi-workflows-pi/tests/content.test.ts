/** The content builders table and the cards Pi draws for workflow messages. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { ExtensionAPI, MessageRenderer, Theme } from "@mariozechner/pi-coding-agent";
import { piMessageFor, registerRenderers, startsTurn } from "../piw_pi/extensions/session/content.js";
import { workflowMessage } from "./fixtures.js";

describe("piMessageFor", () => {
	test("a step is a shown custom message that starts a turn, its id in the details", () => {
		const built = piMessageFor(workflowMessage({ details: { step: "plan", workflowMessageId: "forged" } }));
		assert.deepEqual(built, {
			message: {
				customType: "pi-workflows-step",
				content: "Write the plan.",
				display: true,
				details: { runId: "run-1", step: "plan", workflowMessageId: "message-1" },
			},
			options: { triggerTurn: true },
		});
	});

	test("each kind has its presentation", () => {
		const table = ["step", "decision", "notification", "terminal", "followUp"].map((kind) => {
			const { message, options } = piMessageFor(workflowMessage({ kind }));
			return [kind, message.customType, message.display, options.triggerTurn, startsTurn(kind)];
		});
		assert.deepEqual(table, [
			["step", "pi-workflows-step", true, true, true],
			["decision", "pi-workflows-interaction", true, false, false],
			["notification", "pi-workflows-notification", true, false, false],
			["terminal", "pi-workflows-presentation", false, true, true],
			["followUp", "pi-workflows-follow-up", true, true, true],
		]);
	});

	test("an unknown kind is refused", () => {
		assert.throws(() => piMessageFor(workflowMessage({ kind: "gossip" })), /Unknown workflow message kind gossip/);
		assert.equal(startsTurn("gossip"), false);
	});
});

describe("the cards", () => {
	const renderers = new Map<string, MessageRenderer>();
	registerRenderers({
		registerMessageRenderer: (customType: string, renderer: MessageRenderer) => renderers.set(customType, renderer),
	} as unknown as ExtensionAPI);
	const theme = { fg: (_color: string, text: string) => text, bg: (_color: string, text: string) => text } as unknown as Theme;

	function draw(customType: string, details: unknown, content: string, expanded = false): string {
		const renderer = renderers.get(customType);
		assert.ok(renderer, `no renderer for ${customType}`);
		const card = renderer({ role: "custom", customType, content, display: true, details, timestamp: 0 }, { expanded }, theme);
		assert.ok(card);
		return card
			.render(80)
			.map((line) => line.trimEnd())
			.join("\n");
	}

	test("a step card names the workflow, the step, its status detail and why it came again", () => {
		const text = draw(
			"pi-workflows-step",
			{ contract: { workflowName: "two-turn" }, step: "plan", presentation: { statusDetail: "2 of 3" }, reason: "resumed" },
			"Write the plan.",
		);
		assert.match(text, /▶ two-turn › plan/);
		assert.match(text, /2 of 3/);
		assert.match(text, /resumed/);
		assert.doesNotMatch(text, /Write the plan/, "collapsed cards leave the prompt out");
		assert.match(draw("pi-workflows-step", {}, "Write the plan.", true), /▶ workflow › step[\s\S]*Write the plan\./);
	});

	test("a decision card lists its choices and how to answer", () => {
		const text = draw(
			"pi-workflows-interaction",
			{ choices: { ship: { label: "Ship it" }, hold: {} } },
			"Release now?\nThe tests pass.",
		);
		assert.match(text, /◆ decision: Release now\?/);
		assert.match(text, /ship {2}Ship it/);
		assert.match(text, /hold {2}hold/);
		assert.match(text, /answer with \/workflow answer CHOICE/);
	});

	test("a notification card shows its node and first line, whatever the details hold", () => {
		assert.match(draw("pi-workflows-notification", { nodeId: "build" }, "Built.\nmore"), /• build: Built\./);
		assert.match(draw("pi-workflows-notification", "not an object", "Built."), /• workflow: Built\./);
	});
});
