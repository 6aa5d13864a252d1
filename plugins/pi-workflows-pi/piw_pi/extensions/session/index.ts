/**
 * pi-workflows for Pi: makes this Pi session a workflow session (SPEC §16, item 2).
 *
 * `pi-workflows pi install` lists it in Pi's settings, so plain `pi` loads it (or, for one
 * run, `pi -e "$(pi-workflows pi extension-path)"`). The session id is Pi's own, or
 * `PI_WORKFLOWS_SESSION_ID`; the host is the one of `PI_WORKFLOWS_HOME`, found (and started)
 * through the CLI named by `PI_WORKFLOWS_CLI` (default `pi-workflows`).
 */

import { StringEnum } from "@mariozechner/pi-ai";
import type { ExtensionAPI, ExtensionContext } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";
import { WorkflowActions } from "./actions.js";
import { ACTION_NAMES, COMMAND_FORMS, completions, parseCommand } from "./command.js";
import { registerRenderers } from "./content.js";
import type { RunStatus } from "./envelope.js";
import { WorkflowSession } from "./session.js";

function text(value: unknown): string {
	return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function runLine(status: RunStatus): string {
	const detail = status.statusDetail ? ` — ${status.statusDetail}` : "";
	return `${status.workflowName} ${status.runId}: ${status.status}${status.paused ? " (paused)" : ""}${detail}`;
}

export default function piWorkflows(pi: ExtensionAPI): void {
	let session: WorkflowSession | null = null;
	const actions = new WorkflowActions(() => session);

	registerRenderers(pi);

	pi.registerTool({
		name: "workflow",
		label: "Workflow",
		description:
			"pi-workflows: list and start workflows of this project, check or control the session's run, " +
			"answer a checkpoint, and publish updates or submit the output of the workflow step you are working on.",
		promptSnippet: "Start, inspect and control pi-workflows runs; submit workflow step outputs",
		promptGuidelines: [
			'When a workflow step message asks for a result, call workflow with action "submit", its step and attempt, and "output".',
			"Use workflow only for runs of this session; a human decision is answered by the person, never by workflow.",
		],
		parameters: Type.Object(
			{
				action: StringEnum(ACTION_NAMES, { description: "What to do" }),
				workflow: Type.Optional(Type.String({ description: "start: the workflow name" })),
				input: Type.Optional(Type.Unknown({ description: "start: the run input; answer: the checkpoint answer" })),
				runId: Type.Optional(Type.String({ description: "status/pause/resume/cancel/answer: a run of this session" })),
				requestId: Type.Optional(Type.String({ description: "update/submit: the step request id" })),
				step: Type.Optional(Type.String({ description: "update/submit: the step name" })),
				attempt: Type.Optional(Type.String({ description: "update/submit: the step attempt" })),
				output: Type.Optional(Type.Unknown({ description: "submit: the step's result" })),
				update: Type.Optional(Type.Unknown({ description: "update: a progress update object" })),
			},
			{ additionalProperties: false },
		),
		async execute(toolCallId, params, _signal, _onUpdate, ctx) {
			const target = { requestId: params.requestId, step: params.step, attempt: params.attempt };
			let result: unknown;
			switch (params.action) {
				case "list":
					result = await actions.listWorkflows(ctx.cwd);
					break;
				case "start":
					result = await actions.start(params.workflow, params.input, ctx.cwd, `start-${toolCallId}`);
					break;
				case "status":
					result = runLine(await actions.status(params.runId));
					break;
				case "answer":
					result = await actions.answerAsModel(params.input, params.runId);
					break;
				case "update":
					result = await actions.update(target, params.update, toolCallId);
					break;
				case "submit":
					await actions.submit(target, params.output, toolCallId);
					result = "The workflow accepted the output; the step is complete.";
					break;
				case "pause":
				case "resume":
				case "cancel":
					result = await actions.control(`run.${params.action}`, params.runId);
					break;
				default:
					throw new Error(`Unknown workflow action ${String(params.action)}; use one of ${ACTION_NAMES.join(", ")}.`);
			}
			return { content: [{ type: "text", text: text(result) }], details: { action: params.action } };
		},
	});

	pi.registerCommand("workflow", {
		description: `pi-workflows: ${COMMAND_FORMS}`,
		getArgumentCompletions: completions,
		handler: async (args, ctx) => {
			const say = (message: string, level: "info" | "warning" | "error" = "info") => ctx.ui.notify(message, level);
			try {
				const command = parseCommand(args);
				switch (command.action) {
					case "start": {
						const started = await actions.start(command.workflow, command.input, ctx.cwd);
						say(`Started ${command.workflow}: run ${started.runId}`);
						break;
					}
					case "list":
						say(await actions.listWorkflows(ctx.cwd));
						break;
					case "status":
						say(runLine(await actions.status()));
						break;
					case "answer":
						say(`Answered: ${text(await actions.answerAsPerson(command.answer))}`);
						break;
					case "pause":
					case "resume":
					case "cancel":
						await actions.control(`run.${command.action}`);
						say(`Workflow run: ${command.action} requested.`);
						break;
					case "usage":
						say(`Usage: ${COMMAND_FORMS}`, "warning");
						break;
				}
			} catch (error) {
				say(`pi-workflows: ${(error as Error).message}`, "error");
			}
		},
	});

	function begin(ctx: ExtensionContext): void {
		session?.stop();
		const sessionId = process.env.PI_WORKFLOWS_SESSION_ID || ctx.sessionManager.getSessionId();
		session = new WorkflowSession(
			sessionId,
			ctx.cwd,
			{
				isIdle: () => ctx.isIdle(),
				hasPendingMessages: () => ctx.hasPendingMessages(),
				branch: () => ctx.sessionManager.getBranch(),
				sendMessage: (message, options) => pi.sendMessage(message, options),
			},
			(message, level) => {
				if (ctx.hasUI) ctx.ui.notify(message, level);
			},
		);
		session.start();
	}

	pi.on("session_start", async (_event, ctx) => begin(ctx));
	pi.on("session_shutdown", async () => {
		session?.stop();
		session = null;
	});
	pi.on("agent_start", async () => session?.coordinator.agentStarted());
	pi.on("agent_end", async (event, ctx) => {
		if (session?.coordinator.agentEnded(event.messages)) {
			// Pi schedules its automatic retry of a failed turn right after this handler;
			// for a workflow turn the host has failed the step instead, so the retry is
			// cancelled (abort() cancels a pending retry) once it is scheduled.
			setTimeout(() => ctx.abort(), 0);
		}
	});
}
