"""Decision channel adapters: configuration, the channel interface's host side, and lanes.

A channel is an object a plugin factory builds (``piw_register_decision_channels``).
The host calls its ``deliver``, ``settle`` and ``close`` on a **lane**: one daemon
thread per channel, so a slow or hung channel delays only itself, never the host's
event loop or another channel. Answers come back through
:meth:`ChannelContext.report_answer`, which any thread may call.

Configuration: ``<config>/channels.toml`` (or ``channels.json``), mode 0600::

    [audiences]
    operator = ["session", "cli", "ops-hook"]

    [channels.ops-hook]
    kind = "webhook"                 # a registered channel kind
    allowed_actors = ["alice"]       # who may answer through this channel
    secret_file = "/abs/path/secret" # credentials by file reference (mode 0600)
    url = "https://example.test/decisions"

Every ``*_file`` key is a credential reference: the host reads the file and hands the
channel ``credentials[<key without _file>]``; the value is never logged. Audiences
that the file does not name use the built-in channels ``session`` and ``cli``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import stat
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import plugins
from ..canonical import is_json_value
from ..clock import now_ms
from ..errors import ChannelConfigError, ChannelDeliveryError
from ..records import AnswerResult, ChannelContext, ChannelGaveUp, ChannelSettings
from ..settings import number as setting_number
from ..storage import channel_effects, decision_records
from ..storage.decision_records import HumanDecision

if TYPE_CHECKING:
    from .services import HostServices

log = logging.getLogger("pi_workflows.host.decision_channel_runner")

DEFAULT_CHANNELS = ("session", "cli")
CHANNEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RESERVED_KEYS = ("kind", "allowed_actors", "delivery_attempts", "retry_delay_ms")


@dataclass(frozen=True)
class ChannelConfig:
    audiences: Mapping[str, tuple[str, ...]]
    channels: Mapping[str, ChannelSettings]

    def channels_for(self, audience: str) -> tuple[str, ...]:
        return self.audiences.get(audience, DEFAULT_CHANNELS)

    @classmethod
    def defaults(cls) -> ChannelConfig:
        return cls({}, {name: ChannelSettings(name, name) for name in DEFAULT_CHANNELS})


def load_channel_config(config_dir: Path) -> ChannelConfig:
    """Read `<config>/channels.toml` or `.json`; the built-ins alone when neither exists."""
    for name, parse in (("channels.toml", tomllib.loads), ("channels.json", json.loads)):
        path = config_dir / name
        if path.exists():
            _require_private_file(path, "The decision channel configuration")
            try:
                raw = parse(path.read_text())
            except (ValueError, tomllib.TOMLDecodeError) as error:
                raise ChannelConfigError(f"{path} is not valid: {error}") from None
            return _parse_config(raw, path)
    return ChannelConfig.defaults()


def _require_private_file(path: Path, what: str) -> None:
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ChannelConfigError(f"{what} {path} must be a regular file.")
    if info.st_mode & 0o077:
        raise ChannelConfigError(f"{what} {path} is readable by others; run 'chmod 600 {path}'.")


def _parse_config(raw: Any, path: Path) -> ChannelConfig:
    if not isinstance(raw, dict) or set(raw) - {"audiences", "channels"}:
        raise ChannelConfigError(f"{path} may contain only 'audiences' and 'channels'.")
    channels = dict(ChannelConfig.defaults().channels)
    for name, table in (raw.get("channels") or {}).items():
        channels[name] = _parse_channel(name, table, path)
    audiences: dict[str, tuple[str, ...]] = {}
    for audience, names in (raw.get("audiences") or {}).items():
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ChannelConfigError(f"{path}: audience {audience!r} needs a list of channels.")
        for name in names:
            if name not in channels:
                raise ChannelConfigError(
                    f"{path}: audience {audience!r} references unknown channel {name!r}."
                )
        audiences[audience] = tuple(names)
    return ChannelConfig(audiences, channels)


def _parse_channel(name: str, table: Any, path: Path) -> ChannelSettings:
    if not CHANNEL_NAME.match(name) or not isinstance(table, dict):
        raise ChannelConfigError(f"{path}: channel {name!r} needs a simple name and a table.")
    kind = table.get("kind", name)
    actors = table.get("allowed_actors")
    if actors is not None and (
        not isinstance(actors, list) or not all(isinstance(a, str) and a for a in actors)
    ):
        raise ChannelConfigError(f"{path}: channel {name!r} allowed_actors must list names.")
    options: dict[str, Any] = {}
    credentials: dict[str, str] = {}
    for key, value in table.items():
        if key in RESERVED_KEYS:
            continue
        if key.endswith("_file"):
            credentials[key.removesuffix("_file")] = _read_credential(name, key, value)
        else:
            options[key] = value
    return ChannelSettings(
        name,
        kind,
        tuple(actors) if actors is not None else None,
        options,
        credentials,
        delivery_attempts=_whole_number(table, "delivery_attempts", 3, 1, name, path),
        retry_delay_ms=_whole_number(table, "retry_delay_ms", 1000, 0, name, path),
    )


def _whole_number(
    table: dict[str, Any], key: str, default: int, least: int, channel: str, path: Path
) -> int:
    value = table.get(key, default)
    if type(value) is not int or value < least:
        raise ChannelConfigError(
            f"{path}: channel {channel!r} {key} must be a whole number of at least {least}, "
            f"got {value!r}."
        )
    return value


def _read_credential(channel: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise ChannelConfigError(f"Channel {channel!r}: {key} must be an absolute path.")
    path = Path(value)
    if not path.exists():
        raise ChannelConfigError(f"Channel {channel!r}: credential file {path} does not exist.")
    _require_private_file(path, f"Channel {channel!r} credential file")
    secret = path.read_text().strip()
    if not secret:
        raise ChannelConfigError(f"Channel {channel!r}: credential file {path} is empty.")
    return secret


class Lane:
    """One daemon thread that runs a channel's calls in order.

    Daemon, so a channel stuck in a call can never keep the host process alive.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"piw-channel-{name}", daemon=True)
        self._thread.start()

    def call(self, function: Callable[..., Any], *args: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((function, args, future, loop))
        return future

    def close(self) -> None:
        self._calls.put(None)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` s for the calls queued before `close()` to finish."""
        self._thread.join(max(timeout, 0.0))

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            function, args, future, loop = item
            try:
                outcome: tuple[Any, BaseException | None] = (function(*args), None)
            except BaseException as error:  # handed to the waiting coroutine
                outcome = (None, error)
            try:
                loop.call_soon_threadsafe(_settle_future, future, *outcome)
            except RuntimeError:
                return  # the loop is gone: the host has stopped


def _settle_future(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return  # the host stopped waiting (timeout); the late result is dropped
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


ANSWER_TIMEOUT_S = 30.0
# How long a stopping host waits, in all, for its channels' close() calls.
CLOSE_WAIT_S = 5.0


class ChannelRunner:
    """Runs the configured channels for one host: deliveries, settlements, answers.

    `answer(decision_id, response, channel, actor)` is the host's answer path (runs on
    the loop, inside a transaction) and returns the protocol-style result.
    """

    def __init__(self, services: HostServices, answer: Callable[..., dict[str, Any]]) -> None:
        self.services = services
        self._answer = answer
        self.config = ChannelConfig.defaults()
        self.channels: dict[str, Any] = {}
        self.lanes: dict[str, Lane] = {}
        self.in_flight: set[str] = set()
        # Why the configuration was not used, and why a channel is not running (by name):
        # shown by `host status` and `channel.status`, not only logged.
        self.config_error: str | None = None
        self.start_errors: dict[str, str] = {}
        self._marked_interrupted = False
        self.call_timeout_s = setting_number("channel_call_timeout_s")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, config_dir: Path) -> None:
        """Load the configuration and build every channel on its own lane."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        try:
            self.config = load_channel_config(config_dir)
        except ChannelConfigError as error:
            self.config_error = str(error)
            log.error("decision channels use the built-ins only: %s", error)
        if self.services.is_duty_host:
            self._mark_interrupted()
        factories = plugins.decision_channel_factories()
        for settings in self.config.channels.values():
            factory = factories.get(settings.kind)
            if factory is None:
                self.start_errors[settings.name] = (
                    f"unknown kind {settings.kind!r} (no plugin registers it)"
                )
                log.error(
                    "decision channel %s has %s", settings.name, self.start_errors[settings.name]
                )
                continue
            lane = self.lanes[settings.name] = Lane(settings.name)
            context = ChannelContext(
                settings,
                self._report_answer_for(settings.name),
                self._store_call,
            )
            self.services.spawn(self._build(settings.name, lane, factory, context))

    async def _build(self, name: str, lane: Lane, factory: Any, context: ChannelContext) -> None:
        try:
            self.channels[name] = await asyncio.wait_for(
                asyncio.shield(lane.call(factory, context)), self.call_timeout_s
            )
        except Exception as error:
            self.start_errors[name] = f"failed to start: {_describe(error)}"
            log.error("decision channel %s %s", name, self.start_errors[name])
            return
        self.pump()

    def status(self) -> dict[str, Any]:
        """Channel health (reference `channel.status`): whether the configuration is in
        use, each channel's state, and the channel effects that wait for an operator."""
        channels = []
        for name, settings in self.config.channels.items():
            error = self.start_errors.get(name)
            state = "running" if name in self.channels else "failed" if error else "starting"
            channels.append(
                {"channel": name, "kind": settings.kind, "state": state, "error": error}
            )
        return {
            "configured": self.config_error is None,
            "error": self.config_error,
            "channels": channels,
            **channel_effects.channel_effects_needing_an_operator(),
        }

    def close(self) -> None:
        """The host is stopping: each channel's `close()` is its lane's last call. The
        lanes are daemon threads, so the host waits for those calls (a bounded while: a
        channel stuck in one cannot hold the stop) before its process exits."""
        for name, lane in self.lanes.items():
            channel = self.channels.get(name)
            if channel is not None and hasattr(channel, "close"):
                lane.call(channel.close)
            lane.close()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for lane in self.lanes.values():
            lane.join(deadline - time.monotonic())

    # --- answers and store calls from channel threads ------------------------------------

    def _report_answer_for(self, channel: str) -> Callable[..., AnswerResult]:
        def report_answer(
            decision_id: str, choice: str, input: Any = None, *, actor: str
        ) -> AnswerResult:
            response: dict[str, Any] = {"choice": choice}
            if input is not None:
                response["input"] = input
            return self._from_thread(lambda: self._answer(decision_id, response, channel, actor))

        return report_answer

    def _store_call(self, function: Callable[[], Any]) -> Any:
        def in_transaction() -> Any:
            with self.services.store.transaction():
                return function()

        return self._from_thread(in_transaction)

    def _from_thread(self, function: Callable[[], Any]) -> Any:
        loop = self._loop
        if loop is None or self.services.is_stopping:
            raise ChannelConfigError("The workflow host is not accepting channel calls.")
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("Channel callbacks must not be called on the host's event loop.")

        async def run() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(ANSWER_TIMEOUT_S)

    # --- deliveries and settlements ------------------------------------------------------

    def _mark_interrupted(self) -> None:
        """Attempts left `applying` by no live runner may or may not have been delivered."""
        with self.services.store.transaction():
            interrupted = channel_effects.mark_interrupted_channel_effects(set(self.in_flight))
        self._marked_interrupted = True
        if interrupted:
            log.warning("%d channel effect(s) were interrupted and need an operator", interrupted)

    def _runs_channel_effects(self) -> bool:
        """Whether this host runs channel effects now (it is the duty host and serving)."""
        if self.services.is_stopping or self._loop is None:
            return False
        if not self.services.is_duty_host:
            self._marked_interrupted = False
            return False  # the oldest live host of a shared database runs channel effects
        if not self._marked_interrupted:
            self._mark_interrupted()  # this host just took the duty over
        return True

    def pump(self) -> None:
        """Start every delivery and settlement that is due (poll timer and events).

        Called inside a transaction, it begins the attempts in that transaction, so they
        cost no commit of their own, and the channel calls start once it commits. A
        delivery to a channel without `deliver`, and a settlement on one without `settle`,
        is recorded applied at once, with no call.
        """
        if not self._runs_channel_effects():
            return
        now = now_ms()
        candidates: list[tuple[str, str, str]] = []
        for decision in decision_records.pending_decisions():
            for name in self.config.channels_for(decision.audience):
                candidates.append((decision.decision_id, name, "delivery"))
        for decision, name in channel_effects.deliveries_to_settle():
            candidates.append((decision.decision_id, name, "settlement"))
        # Reads first: an idle tick takes no write lock.
        due = [
            (decision_id, name, purpose)
            for decision_id, name, purpose in candidates
            if name in self.channels  # not built (yet), or failed to start: nothing to call
            and channel_effects.channel_effect_id(decision_id, name, purpose) not in self.in_flight
            and channel_effects.channel_effect_is_due(decision_id, name, purpose, now)
        ]
        if not due:
            return
        started: list[tuple[str, int, str, str, str]] = []
        with self.services.store.transaction():
            for decision_id, name, purpose in due:
                if not _calls(self.channels[name], purpose):
                    channel_effects.record_without_call(decision_id, name, purpose, now)
                    continue
                attempt = channel_effects.begin_channel_effect(decision_id, name, purpose, now)
                if attempt is not None:
                    effect_id = channel_effects.channel_effect_id(decision_id, name, purpose)
                    started.append((effect_id, attempt, decision_id, name, purpose))
            if started:
                self.services.store.after_commit(lambda: self._start(started))

    def begin_deliveries(self, decision_id: str, audience: str) -> None:
        """Inside the transaction that created a decision: its deliveries begin in that
        commit and the channels are called once it commits (a channel without `deliver`
        is recorded delivered there, with no call)."""
        self._begin(decision_id, audience, "delivery")

    def begin_settlements(self, decision: HumanDecision) -> None:
        """Inside the transaction that resolved `decision`: its settlements begin in that
        commit. A channel without `settle` is recorded settled there, with no call, so no
        channel commit runs between an answer and its continuation."""
        self._begin(decision.decision_id, decision.audience, "settlement")

    def _begin(self, decision_id: str, audience: str, purpose: str) -> None:
        # Only this decision's channels: what else is due (retries, a channel built
        # late, a delivery that finished after the answer) the poll timer's pump starts.
        if not self._runs_channel_effects():
            return
        now = now_ms()
        started: list[tuple[str, int, str, str, str]] = []
        with self.services.store.transaction():
            for name in self.config.channels_for(audience):
                channel = self.channels.get(name)
                effect_id = channel_effects.channel_effect_id(decision_id, name, purpose)
                if channel is None or effect_id in self.in_flight:
                    continue
                if purpose == "settlement":
                    attempt = channel_effects.begin_settlement(
                        decision_id, name, now, call=_calls(channel, purpose)
                    )
                elif _calls(channel, purpose):
                    attempt = channel_effects.begin_channel_effect(decision_id, name, purpose, now)
                else:
                    channel_effects.record_without_call(decision_id, name, purpose, now)
                    attempt = None
                if attempt is not None:
                    started.append((effect_id, attempt, decision_id, name, purpose))
            if started:
                self.services.store.after_commit(lambda: self._start(started))

    def _start(self, started: list[tuple[str, int, str, str, str]]) -> None:
        for effect_id, attempt, decision_id, name, purpose in started:
            self.in_flight.add(effect_id)
            self.services.spawn(self._perform(effect_id, attempt, decision_id, name, purpose))

    async def _perform(
        self, effect_id: str, attempt: int, decision_id: str, name: str, purpose: str
    ) -> None:
        channel = self.channels[name]
        with self.services.store.transaction():
            decision = decision_records.get_decision(decision_id)
            request = decision_records.channel_request(decision)
            if purpose == "delivery":
                call: tuple[Any, ...] = (channel.deliver, request)
            else:
                resolution = decision_records.decision_json(decision)["resolution"]
                delivered = channel_effects.delivery_result(decision_id, name)
                call = (channel.settle, request, resolution, delivered)
        result, error = None, None
        try:
            result = await asyncio.wait_for(
                asyncio.shield(self.lanes[name].call(*call)), self.call_timeout_s
            )
            outcome = "applied"
        except TimeoutError:
            outcome, error = "ambiguous", f"no answer within {self.call_timeout_s:g} s"
        except ChannelDeliveryError as failure:
            outcome, error = "rejected", str(failure)
        except Exception as failure:
            outcome, error = "ambiguous", _describe(failure)
        finally:
            self.in_flight.discard(effect_id)
        if self.services.is_stopping:
            return  # left `applying`: the next start marks it ambiguous for an operator
        policy = self.config.channels[name]
        with self.services.store.transaction():
            finished = channel_effects.finish_channel_effect(
                effect_id,
                attempt,
                outcome,
                result=_json_or_none(result),
                error=error,
                attempts=policy.delivery_attempts,
                retry_delay_ms=policy.retry_delay_ms,
            )
        if outcome == "applied":
            return
        log.warning("decision channel %s %s attempt %d: %s", name, purpose, attempt, outcome)
        if finished and outcome == "rejected" and attempt >= policy.delivery_attempts:
            log.warning(
                "decision channel %s gave up the %s of decision %s after %d attempts: "
                "pi-workflows effects retry %s",
                name,
                purpose,
                decision_id,
                attempt,
                effect_id,
            )
            plugins.channel_gave_up(
                ChannelGaveUp(
                    channel_name=name,
                    channel_kind=self.config.channels[name].kind,
                    purpose=purpose,
                    effect_id=effect_id,
                    attempts=attempt,
                    error=error or "",
                    at=now_ms(),
                    request=request,
                    channel=channel,
                )
            )


def _calls(channel: Any, purpose: str) -> bool:
    """Whether `channel` is called for `purpose`: one without `deliver` (or `settle`)
    has nothing to do for it, and its effect is recorded applied with no call."""
    return hasattr(channel, "deliver" if purpose == "delivery" else "settle")


def _json_or_none(value: Any) -> Any:
    return value if is_json_value(value) else None


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:500]
