/**
 * The workflow actions, written once. The model's `workflow` tool takes every action; the
 * person's `/workflow` command takes those with a `usage` (the model's `update` and `submit`
 * are not the person's). The tool's action enum, the command's usage line, description and
 * completions, and its parser all come from `ACTIONS`.
 */

export const ACTIONS = {
	start: { usage: "start NAME [JSON]" },
	list: { usage: "list" },
	status: { usage: "status" },
	answer: { usage: "answer CHOICE|JSON" },
	update: { usage: null },
	submit: { usage: null },
	pause: { usage: "pause" },
	resume: { usage: "resume" },
	cancel: { usage: "cancel" },
} as const;

export type ActionName = keyof typeof ACTIONS;
/** The actions the `/workflow` command takes as its first word. */
export type CommandAction = {
	[Name in ActionName]: (typeof ACTIONS)[Name]["usage"] extends null ? never : Name;
}[ActionName];

export const ACTION_NAMES = Object.keys(ACTIONS) as ActionName[];
export const COMMAND_ACTIONS = ACTION_NAMES.filter(
	(name): name is CommandAction => ACTIONS[name].usage !== null,
);

/** The command's forms: the reference's `/workflow NAME [task text]`, then one per action. */
export const COMMAND_FORMS = `/workflow NAME [task text] | ${COMMAND_ACTIONS.map((name) => ACTIONS[name].usage).join(" | ")}`;

const INPUT_JSON_FLAG = "--input-json";

/** What a `/workflow` command line asks for. */
export type WorkflowCommand =
	| { action: "start"; workflow: string; input: unknown }
	| { action: "answer"; answer: string }
	| { action: Exclude<CommandAction, "start" | "answer"> }
	| { action: "usage" };

function isCommandAction(word: string): word is CommandAction {
	return (COMMAND_ACTIONS as string[]).includes(word);
}

/**
 * The run input a command's text after the workflow name gives (reference engine §1.1):
 * `--input-json JSON` or text that starts like JSON (`{`, `[`) is parsed as JSON, any other
 * text is the task, `{task: "…"}`; no text, no input.
 */
export function commandInput(text: string): unknown {
	if (!text) return undefined;
	const flagged = text.startsWith(INPUT_JSON_FLAG) ? text.slice(INPUT_JSON_FLAG.length).trim() : null;
	const json = flagged ?? (/^[[{]/.test(text) ? text : null);
	if (json === null) return { task: text };
	try {
		return JSON.parse(json);
	} catch {
		throw new Error(`The input is not valid JSON: ${json}`);
	}
}

/** The command `/workflow ARGS` gives; an Error says what is wrong with ARGS. */
export function parseCommand(args: string): WorkflowCommand {
	const trimmed = args.trim();
	const [verb = "", ...rest] = trimmed.split(/\s+/);
	const tail = trimmed.slice(verb.length).trim();
	if (!verb) return { action: "usage" };
	// Any other first word is a workflow's name: `/workflow NAME [task text]`.
	if (!isCommandAction(verb)) return { action: "start", workflow: verb, input: commandInput(tail) };
	switch (verb) {
		case "start": {
			const [workflow = ""] = rest;
			return { action: "start", workflow, input: commandInput(tail.slice(workflow.length).trim()) };
		}
		case "answer":
			if (!tail) throw new Error("Give the answer: a choice key (/workflow answer continue) or JSON.");
			return { action: "answer", answer: tail };
		default:
			return { action: verb };
	}
}

/** The command's completions of the first word typed so far. */
export function completions(prefix: string): Array<{ value: string; label: string }> | null {
	const items = COMMAND_ACTIONS.filter((word) => word.startsWith(prefix)).map((word) => ({ value: word, label: word }));
	return items.length > 0 ? items : null;
}
