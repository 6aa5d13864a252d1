/**
 * One Pi session as a workflow session: it keeps a coordinator connection to the host of
 * `PI_WORKFLOWS_HOME` alive. A dropped socket or a restarted host is reconnected with
 * capped exponential backoff (a new connection is a new coordinator epoch, so the branch
 * is reported again before any turn); while the host cannot be reached Pi shows one notice
 * and keeps working. A second Pi process on the same session id fences this one: it then
 * only watches the session, and takes it back (one notice) once the host shows no
 * coordinator, i.e. the process that took over is gone.
 */

import { randomUUID } from "node:crypto";
import { MessageCoordinator, type PiSide, type SessionView } from "./coordinator.js";
import { isObject, viewProblem } from "./envelope.js";
import {
	HostConnection,
	HostRefused,
	type HostResponse,
	HostUnavailable,
	isOk,
	locateHost,
	type RequestOptions,
} from "./host-link.js";

const TICK_MS = 250;
const BACKOFF_BASE_MS = 250;
const BACKOFF_MAX_MS = 10_000;
const CONNECTED_WAIT_MS = 30_000;

type Notify = (text: string, level: "info" | "warning" | "error") => void;

function backoff(attempt: number): number {
	const window = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** attempt);
	return window / 2 + Math.random() * (window / 2);
}

function sleep(ms: number): Promise<void> {
	return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

export class WorkflowSession {
	readonly coordinator: MessageCoordinator;
	private connection: HostConnection | null = null;
	private epoch: string | null = null;
	private readonly subscriptionId = `session-view-${randomUUID()}`;
	private stopped = false;
	private reconnecting = false;
	private unreachableShown = false;
	private tick: NodeJS.Timeout | null = null;
	private connectedWaiters: Array<() => void> = [];

	constructor(
		readonly sessionId: string,
		readonly cwd: string,
		pi: PiSide,
		private readonly notify: Notify,
	) {
		this.coordinator = new MessageCoordinator(
			sessionId,
			pi,
			{ request: (operation, payload, options) => this.coordinatorRequest(operation, payload, options) },
			() => this.fenced(),
			(text) => this.notify(`pi-workflows: ${text}`, "warning"),
			() => this.takeBack(),
		);
	}

	start(): void {
		this.tick = setInterval(() => this.coordinator.schedule(), TICK_MS);
		this.tick.unref();
		void this.reconnect();
	}

	stop(): void {
		this.stopped = true;
		if (this.tick) clearInterval(this.tick);
		this.connection?.close();
	}

	get view(): SessionView | null {
		return this.coordinator.latestView;
	}

	get isFenced(): boolean {
		return this.coordinator.isFenced;
	}

	private async reconnect(): Promise<void> {
		if (this.reconnecting) return;
		this.reconnecting = true;
		try {
			for (let attempt = 0; !this.stopped; attempt++) {
				try {
					await this.connect();
					// Connected as a watcher that found the session free: connect again, now
					// as its coordinator (takeBack closed the watch).
					if (!this.connection && !this.stopped) continue;
					if (this.unreachableShown) this.notify("pi-workflows: connected to the workflow host again.", "info");
					this.unreachableShown = false;
					return;
				} catch (error) {
					// One notice for the whole outage, whatever each attempt ran into; a
					// refusal (too many connections, another version) is retried like an
					// absent host, since both can clear up without restarting Pi.
					if (!this.unreachableShown) {
						this.unreachableShown = true;
						const what =
							error instanceof HostRefused
								? (error as Error).message
								: `the workflow host is unreachable (${(error as Error).message})`;
						this.notify(`pi-workflows: ${what}; workflow messages resume once it is back.`, "warning");
					}
					await sleep(backoff(attempt));
				}
			}
		} finally {
			this.reconnecting = false;
		}
	}

	/** Connect as the session's coordinator, or, while fenced, as a watcher of its view. */
	private async connect(): Promise<void> {
		const asCoordinator = !this.coordinator.isFenced;
		const connection = await HostConnection.open(await locateHost(this.cwd));
		let firstView: SessionView | null = null;
		let registered = false;
		let complained = false;
		const complain = (why: string) => {
			if (complained) return; // once per connection: a host that sends one bad view sends more
			complained = true;
			this.notify(`pi-workflows: the workflow host sent an invalid session view (${why}); it was ignored.`, "warning");
		};
		connection.onEvent = (event) => {
			if (event.subscriptionId !== this.subscriptionId || event.event !== "session_snapshot") return;
			const problem = viewProblem(event.payload);
			if (problem) {
				complain(problem);
				return;
			}
			const view = event.payload as SessionView; // checked just now
			if (registered) this.coordinator.updateView(view);
			else firstView = view;
		};
		connection.onEventError = (error) => complain(error.message);
		connection.onClose = () => this.lost(connection);
		let response: HostResponse;
		try {
			response = await connection.request("view.session.watch", {
				subscriptionId: this.subscriptionId,
				sessionId: this.sessionId,
				coordinator: asCoordinator,
			});
		} catch (error) {
			connection.close();
			throw error;
		}
		const granted = isObject(response.receipt) ? response.receipt.coordinatorEpoch : undefined;
		if (!isOk(response) || (asCoordinator && typeof granted !== "string")) {
			connection.close();
			throw new Error(response.error ?? "the host did not make this session its coordinator");
		}
		if (this.stopped || !connection.isOpen) {
			connection.close();
			return;
		}
		this.connection = connection;
		this.epoch = asCoordinator && typeof granted === "string" ? granted : null;
		if (this.epoch) this.coordinator.connected(this.epoch);
		registered = true;
		if (firstView) this.coordinator.updateView(firstView);
		for (const resolve of this.connectedWaiters.splice(0)) resolve();
	}

	private lost(connection: HostConnection): void {
		if (this.connection !== connection) return;
		this.connection = null;
		this.epoch = null;
		this.coordinator.disconnected();
		if (!this.stopped) void this.reconnect();
	}

	/** The connection stays open as a watch of the session: it shows when the session is free. */
	private fenced(): void {
		this.epoch = null;
		this.notify(
			"pi-workflows: another Pi process took over this workflow session; this one no longer delivers its workflow messages.",
			"warning",
		);
	}

	/** The Pi process that took over is gone: coordinate again on a new connection. */
	private takeBack(): void {
		const watching = this.connection;
		this.connection = null;
		this.coordinator.unfence();
		watching?.close();
		this.notify(
			"pi-workflows: the Pi process that took over this workflow session is gone; this one coordinates it again.",
			"info",
		);
		void this.reconnect();
	}

	/** Coordinator reports go only to the connection whose epoch they carry. */
	private coordinatorRequest(
		operation: string,
		payload: Record<string, unknown>,
		options?: RequestOptions,
	): Promise<HostResponse> {
		const connection = this.connection;
		if (!connection || payload.coordinatorEpoch !== this.epoch) {
			return Promise.reject(new HostUnavailable("The workflow session is reconnecting."));
		}
		return connection.request(operation, payload, options);
	}

	private async connected(): Promise<HostConnection> {
		if (this.coordinator.isFenced) {
			throw new HostUnavailable("Another Pi process coordinates this workflow session now.");
		}
		if (this.connection) return this.connection;
		void this.reconnect();
		await Promise.race([
			new Promise<void>((resolve) => this.connectedWaiters.push(resolve)),
			sleep(CONNECTED_WAIT_MS),
		]);
		if (!this.connection) throw new HostUnavailable("The workflow host is unreachable; try again shortly.");
		return this.connection;
	}

	/** The session view of the current connection, waiting for a connection and its first view. */
	async currentView(): Promise<SessionView> {
		const deadline = Date.now() + CONNECTED_WAIT_MS;
		for (;;) {
			await this.connected();
			const view = this.coordinator.latestView;
			if (view) return view;
			if (Date.now() > deadline) throw new HostUnavailable("The workflow host sent no session view in time.");
			await sleep(50);
		}
	}

	/** A command of this session; repeated once (same idempotency key) if the connection drops. */
	async request(
		operation: string,
		payload: Record<string, unknown>,
		options: RequestOptions = {},
	): Promise<HostResponse> {
		const stable = { ...options, idempotencyKey: options.idempotencyKey ?? `${operation}-${randomUUID()}` };
		try {
			return await (await this.connected()).request(operation, payload, stable);
		} catch (error) {
			if (!(error instanceof HostUnavailable)) throw error;
			return await (await this.connected()).request(operation, payload, stable);
		}
	}
}
