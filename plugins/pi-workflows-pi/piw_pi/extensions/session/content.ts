/**
 * What a workflow message looks like in Pi: the content builders table of the reference
 * (client-protocol §3.1) maps each kind to its custom message type, visibility and whether
 * it starts a model turn; the renderers draw the compact cards.
 */

import type { ExtensionAPI, Theme } from "@mariozechner/pi-coding-agent";
import { Box, Text } from "@mariozechner/pi-tui";
import { isObject, valueAt } from "./envelope.js";

export interface WorkflowMessage {
	workflowMessageId: string;
	runId: string;
	kind: string;
	status: string;
	order: number;
	content: string;
	details: Record<string, unknown>;
	sessionEntryId: string | null;
}

/** What `pi.sendMessage` takes: a custom message, its details carrying the workflow message id. */
export type PiMessage = Parameters<ExtensionAPI["sendMessage"]>[0];

interface Presentation {
	customType: string;
	display: boolean;
	triggerTurn: boolean;
}

const PRESENTATIONS: Record<string, Presentation> = {
	step: { customType: "pi-workflows-step", display: true, triggerTurn: true },
	decision: { customType: "pi-workflows-interaction", display: true, triggerTurn: false },
	notification: { customType: "pi-workflows-notification", display: true, triggerTurn: false },
	terminal: { customType: "pi-workflows-presentation", display: false, triggerTurn: true },
	followUp: { customType: "pi-workflows-follow-up", display: true, triggerTurn: true },
};

export function startsTurn(kind: string): boolean {
	return PRESENTATIONS[kind]?.triggerTurn === true;
}

/** The `pi.sendMessage` arguments for a workflow message; the hidden id rides in `details`. */
export function piMessageFor(message: WorkflowMessage): { message: PiMessage; options: { triggerTurn: boolean } } {
	const presentation = PRESENTATIONS[message.kind];
	if (!presentation) throw new Error(`Unknown workflow message kind ${message.kind}`);
	return {
		message: {
			customType: presentation.customType,
			content: message.content,
			display: presentation.display,
			details: {
				runId: message.runId,
				...message.details,
				workflowMessageId: message.workflowMessageId,
			},
		},
		options: { triggerTurn: presentation.triggerTurn },
	};
}

const STEP_REASONS: Record<string, string> = {
	reminder: "reminder: the last turn ended without an accepted submission",
	resumed: "resumed",
};

function card(theme: Theme, lines: string[], expanded: boolean, full: string): Box {
	const box = new Box(1, 0, (text: string) => theme.bg("customMessageBg", text));
	const body = expanded ? [...lines, "", full] : lines;
	box.addChild(new Text(body.join("\n"), 0, 0));
	return box;
}

function textOf(content: unknown): string {
	if (typeof content === "string") return content;
	if (Array.isArray(content)) {
		return content.map((part) => (isObject(part) && part.type === "text" ? String(part.text) : "")).join("");
	}
	return "";
}

export function registerRenderers(pi: ExtensionAPI): void {
	pi.registerMessageRenderer("pi-workflows-step", (message, { expanded }, theme) => {
		const details = message.details;
		const workflow = valueAt(details, "contract", "workflowName") ?? "workflow";
		const step = valueAt(details, "step") ?? valueAt(details, "contract", "nodeId") ?? "step";
		const lines = [theme.fg("accent", `▶ ${workflow} › ${step}`)];
		// The node's status detail travels in the message itself (content builders table:
		// `presentation`), so the card says the same thing whenever it is drawn.
		const statusDetail = valueAt(details, "presentation", "statusDetail");
		if (typeof statusDetail === "string" && statusDetail) lines.push(theme.fg("muted", `  ${statusDetail}`));
		const why = valueAt(details, "reason");
		const reason = typeof why === "string" ? STEP_REASONS[why] : undefined;
		if (reason) lines.push(theme.fg("dim", `  ${reason}`));
		return card(theme, lines, expanded, textOf(message.content));
	});
	pi.registerMessageRenderer("pi-workflows-interaction", (message, { expanded }, theme) => {
		const title = textOf(message.content).split("\n")[0];
		const lines = [theme.fg("warning", `◆ decision: ${title}`)];
		const choices = valueAt(message.details, "choices");
		for (const [key, choice] of Object.entries(isObject(choices) ? choices : {})) {
			lines.push(`  ${theme.fg("accent", key)}  ${valueAt(choice, "label") ?? key}`);
		}
		lines.push(theme.fg("dim", "  answer with /workflow answer CHOICE"));
		return card(theme, lines, expanded, textOf(message.content));
	});
	pi.registerMessageRenderer("pi-workflows-notification", (message, { expanded }, theme) => {
		const first = textOf(message.content).split("\n")[0];
		const lines = [theme.fg("muted", `• ${valueAt(message.details, "nodeId") ?? "workflow"}: ${first}`)];
		return card(theme, lines, expanded, textOf(message.content));
	});
	pi.registerMessageRenderer("pi-workflows-follow-up", (message, { expanded }, theme) => {
		const lines = [theme.fg("accent", "▶ workflow follow-up")];
		return card(theme, lines, expanded, textOf(message.content));
	});
}
