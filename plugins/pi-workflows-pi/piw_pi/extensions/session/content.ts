/**
 * What a workflow message looks like in Pi: the content builders table of the reference
 * (client-protocol §3.1) maps each kind to its custom message type, visibility and whether
 * it starts a model turn; the renderers draw the compact cards.
 */

import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { Box, Text } from "@mariozechner/pi-tui";

export interface WorkflowMessage {
	workflowMessageId: string;
	runId: string;
	kind: string;
	status: string;
	order: number;
	content: string;
	details: Record<string, any>;
	sessionEntryId: string | null;
}

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
export function piMessageFor(message: WorkflowMessage) {
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

function card(theme: any, lines: string[], expanded: boolean, full: string) {
	const box = new Box(1, 0, (text: string) => theme.bg("customMessageBg", text));
	const body = expanded ? [...lines, "", full] : lines;
	box.addChild(new Text(body.join("\n"), 0, 0));
	return box;
}

function textOf(content: unknown): string {
	if (typeof content === "string") return content;
	if (Array.isArray(content)) {
		return content.map((part: any) => (part?.type === "text" ? part.text : "")).join("");
	}
	return "";
}

export function registerRenderers(pi: ExtensionAPI): void {
	pi.registerMessageRenderer("pi-workflows-step", (message, { expanded }, theme) => {
		const details = (message.details ?? {}) as Record<string, any>;
		const workflow = details.contract?.workflowName ?? "workflow";
		const lines = [theme.fg("accent", `▶ ${workflow} › ${details.step ?? details.contract?.nodeId ?? "step"}`)];
		// The node's status detail travels in the message itself (content builders table:
		// `presentation`), so the card says the same thing whenever it is drawn.
		const statusDetail = details.presentation?.statusDetail;
		if (typeof statusDetail === "string" && statusDetail) lines.push(theme.fg("muted", `  ${statusDetail}`));
		const reason = STEP_REASONS[details.reason];
		if (reason) lines.push(theme.fg("dim", `  ${reason}`));
		return card(theme, lines, expanded, textOf(message.content));
	});
	pi.registerMessageRenderer("pi-workflows-interaction", (message, { expanded }, theme) => {
		const details = (message.details ?? {}) as Record<string, any>;
		const title = textOf(message.content).split("\n")[0];
		const lines = [theme.fg("warning", `◆ decision: ${title}`)];
		for (const [key, choice] of Object.entries(details.choices ?? {})) {
			const label = (choice as any)?.label ?? key;
			lines.push(`  ${theme.fg("accent", key)}  ${label}`);
		}
		lines.push(theme.fg("dim", "  answer with /workflow answer CHOICE"));
		return card(theme, lines, expanded, textOf(message.content));
	});
	pi.registerMessageRenderer("pi-workflows-notification", (message, { expanded }, theme) => {
		const details = (message.details ?? {}) as Record<string, any>;
		const first = textOf(message.content).split("\n")[0];
		const lines = [theme.fg("muted", `• ${details.nodeId ?? "workflow"}: ${first}`)];
		return card(theme, lines, expanded, textOf(message.content));
	});
	pi.registerMessageRenderer("pi-workflows-follow-up", (message, { expanded }, theme) => {
		const lines = [theme.fg("accent", "▶ workflow follow-up")];
		return card(theme, lines, expanded, textOf(message.content));
	});
}
