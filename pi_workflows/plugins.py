"""The plugin manager and the façade through which the core calls hooks.

Nothing outside this module touches ``pm.hook``: each hook has a named function here
that calls it as its contract (``hookspecs.CONTRACTS``) says and wraps a plugin's
exception in a :class:`PluginError` that names the plugin and the hook.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pluggy

from . import hookspecs
from .builtin import DEFAULT_PLUGINS, ESSENTIAL_PLUGINS
from .errors import PiWorkflowsError, PluginError, PluginLoadError, UnansweredHookError
from .hook_deadline import DeadlineRunner, HookCalls, HookDeadlineError
from .hook_delivery import EXIT_DRAIN_S, Notification, NotificationDelivery

# `X as X`: re-exported, the rest of the code names these through the façade.
from .plugin_imports import warn_about_internal_imports
from .plugin_set import DISABLE_ENV as DISABLE_ENV
from .plugin_set import PLUGINS_ENV as PLUGINS_ENV
from .plugin_set import names_from_env, plugin_entry_points
from .plugin_set import plugin_set_digest as plugin_set_digest
from .records import (
    ChannelGaveUp,
    HostInfo,
    MessageContent,
    NodeAttemptRecord,
    RunRecord,
    StepContract,
    TerminalFacts,
    TurnContext,
    TurnReceipt,
    TurnReport,
    WorkerLaunchEnvelope,
    WorkerProcessSpec,
    WorkerRunCommand,
    WorkerSettings,
)

if TYPE_CHECKING:
    import peewee

DEBUG_HOOKS_ENV = "PI_WORKFLOWS_DEBUG_HOOKS"
_Answer = TypeVar("_Answer")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginSource:
    """Where a registered plugin came from, for `pi-workflows plugins`."""

    kind: str  # builtin | entrypoint | env
    distribution: str | None = None
    version: str | None = None


@dataclass
class PluginRegistry:
    """A loaded plugin manager plus what loading found out."""

    manager: pluggy.PluginManager
    sources: dict[str, PluginSource] = field(default_factory=dict)
    load_errors: list[PluginLoadError] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    tracing: bool = False  # PI_WORKFLOWS_DEBUG_HOOKS


def load_plugins() -> PluginRegistry:
    """Build a plugin manager: built-ins, then entry points, then `PI_WORKFLOWS_PLUGINS`.

    A plugin that fails to import is skipped and recorded in `load_errors` (and warned
    about on stderr), so one broken distribution never takes the CLI or host down.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    registry = PluginRegistry(manager)
    disabled = set(names_from_env(DISABLE_ENV)) - set(ESSENTIAL_PLUGINS)
    registry.disabled = sorted(disabled)
    for name in disabled:
        manager.set_blocked(name)

    for module_name in DEFAULT_PLUGINS:
        if module_name in disabled:
            continue
        manager.register(importlib.import_module(module_name), name=module_name)
        registry.sources[module_name] = PluginSource("builtin", "pi-workflows", _own_version())

    for entry_point in plugin_entry_points():
        if entry_point.name in disabled or manager.has_plugin(entry_point.name):
            continue
        _register_guarded(
            registry,
            entry_point.name,
            functools.partial(_load_entry_point, entry_point.value),
            PluginSource("entrypoint", entry_point.distribution, entry_point.version),
            hint=f"entry point {entry_point.value!r}",
        )

    for module_name in names_from_env(PLUGINS_ENV):
        if module_name in disabled or manager.has_plugin(module_name):
            continue
        _register_guarded(
            registry,
            module_name,
            functools.partial(importlib.import_module, module_name),
            PluginSource("env"),
            hint=f"named in {PLUGINS_ENV}",
        )

    manager.check_pending()
    if os.environ.get(DEBUG_HOOKS_ENV, "") not in ("", "0"):
        registry.tracing = True
        _trace_hook_calls(manager)
    return registry


def _trace_hook_calls(manager: pluggy.PluginManager) -> None:
    """Write every hook call to stderr (the host's log, for the host): pluggy's call monitor.

    Argument and result *types* only: hook arguments carry run inputs, outputs and session
    ids, which never go to a log.
    """

    def before(
        hook_name: str, hook_impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]
    ) -> None:
        order = [impl.plugin_name for impl in reversed(hook_impls)]
        _trace_call(hook_name, kwargs, order)

    def after(
        outcome: pluggy.Result[Any],
        hook_name: str,
        hook_impls: Sequence[pluggy.HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        if outcome.exception is not None:
            _debug_line(f"{hook_name} raised {type(outcome.exception).__name__}")
        else:
            _debug_line(f"{hook_name} returned {_shape(outcome.get_result())}")

    manager.add_hookcall_monitoring(before, after)


def _trace_call(hook_name: str, kwargs: Mapping[str, Any], order: list[str]) -> None:
    arguments = ", ".join(f"{name}={_shape(value)}" for name, value in kwargs.items())
    _debug_line(f"{hook_name}({arguments}) calls {' -> '.join(order) or 'nobody'}")


def _shape(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"{type(value).__name__}[{len(value)}]"
    return "None" if value is None else type(value).__name__


def _debug_line(text: str) -> None:
    print(f"[pi-workflows hooks] {text}", file=sys.stderr, flush=True)


def _register_guarded(
    registry: PluginRegistry,
    name: str,
    load: Callable[[], Any],
    source: PluginSource,
    hint: str,
) -> None:
    try:
        plugin = load()
        registry.manager.register(plugin, name=name)
        _check_hooks_of(registry.manager, name)
    except Exception as exc:  # a broken plugin must not take the CLI or host down
        error = PluginLoadError(
            f"Plugin {name!r} ({hint}) failed to load: {type(exc).__name__}: {exc}"
            f"{_where(exc)}; fix or uninstall it, or disable it with {DISABLE_ENV}={name}."
        )
        error.plugin_name = name
        registry.load_errors.append(error)
        print(f"pi-workflows: warning: {error}", file=sys.stderr)
        return
    registry.sources[name] = source
    warn_about_internal_imports(name, plugin)
    for function_name in _unmarked_hook_functions(plugin):
        print(
            f"pi-workflows: warning: plugin {name!r} defines {function_name} without "
            "@hookimpl, so it is never called; decorate it with pi_workflows.hookimpl.",
            file=sys.stderr,
        )


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)``: where loading failed, in the plugin's code when possible."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen") and frame.filename != __file__
    ]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _unmarked_hook_functions(plugin: object) -> list[str]:
    """`piw_*` functions of a plugin that lack the @hookimpl marker (a silent no-op)."""
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    return sorted(
        name
        for name in dir(plugin)
        if name.startswith("piw_")
        and callable(getattr(plugin, name, None))
        and not hasattr(getattr(plugin, name), marker)
    )


# Hooks the core calls one implementation at a time (their contract's `isolated`), so that
# one failing or hanging plugin cannot keep the others from running; pluggy's wrappers
# (`wrapper=True`, `hookwrapper=True`) wrap a whole hook call and would never run there,
# so a plugin that wraps one of these is refused when it loads. Other hooks may be wrapped.
ONE_AT_A_TIME_HOOKS = frozenset(
    name for name, contract in hookspecs.CONTRACTS.items() if contract.isolated
)


def _check_hooks_of(manager: pluggy.PluginManager, name: str) -> None:
    """Unregister and raise when plugin `name` implements a hook that has no spec, or
    wraps a hook the core calls one implementation at a time.

    `check_pending()` over the whole manager would fail the load of every plugin for one
    misspelt hook; checking right after each registration pins the error on its plugin.
    """
    _refuse_wrappers(manager, name)
    plugin = manager.get_plugin(name)
    unknown = sorted(
        caller.name for caller in manager.get_hookcallers(plugin) or [] if caller.spec is None
    )
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as error:
        manager.unregister(name=name)
        if not unknown:
            raise
        raise pluggy.PluginValidationError(
            plugin, "; ".join(_unknown_hook_sentence(hook) for hook in unknown)
        ) from error


def _refuse_wrappers(manager: pluggy.PluginManager, name: str) -> None:
    """Unregister and raise when plugin `name` wraps one of `ONE_AT_A_TIME_HOOKS`."""
    plugin = manager.get_plugin(name)
    wrapped = sorted(
        caller.name
        for caller in manager.get_hookcallers(plugin) or []
        if caller.name in ONE_AT_A_TIME_HOOKS
        for impl in caller.get_hookimpls()
        if impl.plugin_name == name and (impl.wrapper or impl.hookwrapper)
    )
    if wrapped:
        manager.unregister(name=name)
        raise pluggy.PluginValidationError(
            plugin,
            f"it wraps {', '.join(wrapped)}, which pi-workflows calls one implementation "
            "at a time, so the wrapper would never run; implement it without "
            "wrapper=True / hookwrapper=True",
        )


def _unknown_hook_sentence(hook: str) -> str:
    known = list(hookspecs.CONTRACTS)
    close = difflib.get_close_matches(hook, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else " (see pi_workflows/hookspecs.py)"
    return f"unknown hook {hook}{hint}"


def _load_entry_point(value: str) -> object:
    """What an entry point's value names: a module, or an attribute path in one."""
    module_name, _, attributes = value.partition(":")
    target: object = importlib.import_module(module_name.strip())
    for attribute in filter(None, attributes.strip().split(".")):
        target = getattr(target, attribute)
    return target


def _own_version() -> str:
    from . import __version__

    return __version__


_registry: PluginRegistry | None = None


def registry() -> PluginRegistry:
    """The process-wide plugin registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_plugins()
    return _registry


def reload() -> PluginRegistry:
    """Forget the loaded plugins and load them again (after the environment changed)."""
    global _registry
    _registry = None
    return registry()


@contextlib.contextmanager
def temporary_plugin(plugin: object, name: str | None = None) -> Iterator[str]:
    """Register `plugin` for the duration of a block (tests, embedding)."""
    manager = registry().manager
    registered_name = manager.register(plugin, name=name)
    if registered_name is None:  # pluggy's answer for a name set_blocked() refuses
        raise PluginError(f"Plugin {name!r} is blocked; it cannot be registered.")
    _refuse_wrappers(manager, registered_name)
    try:
        yield registered_name
    finally:
        # The notifications of the block reach the plugin before it goes.
        _delivery.drain(EXIT_DRAIN_S)
        manager.unregister(name=registered_name)


def describe_plugins() -> list[dict[str, Any]]:
    """Every registered plugin with its source, distribution, version and hooks."""
    reg = registry()
    described = []
    for name, plugin in reg.manager.list_name_plugin():
        if plugin is None:
            continue
        source = reg.sources.get(name, PluginSource("runtime"))
        hooks = sorted(caller.name for caller in reg.manager.get_hookcallers(plugin) or [])
        described.append(
            {
                "name": name,
                "kind": source.kind,
                "distribution": source.distribution,
                "version": source.version,
                "hooks": hooks,
            }
        )
    for error in reg.load_errors:
        described.append(
            {
                "name": error.plugin_name,
                "kind": "broken",
                "distribution": None,
                "version": None,
                "hooks": [],
                "error": str(error),
            }
        )
    return described


def describe_hooks() -> list[dict[str, Any]]:
    """Every hook with its implementations in call order: the first one answers first."""
    manager = registry().manager
    described = []
    for name, contract in sorted(hookspecs.CONTRACTS.items()):
        caller = getattr(manager.hook, name)
        described.append(
            {
                "hook": name,
                "firstresult": contract.kind == "first-result",
                "implementations": [impl.plugin_name for impl in reversed(caller.get_hookimpls())],
            }
        )
    return described


# --- calling hooks -----------------------------------------------------------------------


def _culprit(hook_name: str, tb: TracebackType | None) -> str:
    """Name the plugin whose hook implementation appears in the traceback."""
    return _owner_of(hook_name, (frame for frame, _ in traceback.walk_tb(tb)))


def _culprit_in_frame(hook_name: str, frame: FrameType | None) -> str:
    """Name the plugin whose hook implementation a thread's stack is in (innermost)."""
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    return _owner_of(hook_name, stack)


def _owner_of(hook_name: str, frames: Iterable[FrameType]) -> str:
    """The plugin owning the first of `frames` that runs one of `hook_name`'s
    implementations."""
    caller = getattr(registry().manager.hook, hook_name)
    code_owner: dict[CodeType, str] = {
        impl.function.__code__: impl.plugin_name for impl in caller.get_hookimpls()
    }
    for frame in frames:
        if frame.f_code in code_owner:
            return code_owner[frame.f_code]
    return "unknown plugin"


def _call(hook_name: str, **kwargs: Any) -> Any:
    _check_transaction(hook_name)
    return _call_caller(hook_name, getattr(registry().manager.hook, hook_name), **kwargs)


def _call_caller(hook_name: str, caller: Any, **kwargs: Any) -> Any:
    """A pluggy hook call, its failure named: the plugin and the hook."""
    try:
        return caller(**kwargs)
    except PiWorkflowsError:
        # Already a user-facing sentence (a plugin refusing bad input on purpose, say).
        raise
    except Exception as exc:
        plugin = _culprit(hook_name, exc.__traceback__)
        raise PluginError(
            f"Plugin {plugin!r} failed in hook {hook_name}: {type(exc).__name__}: {exc}"
        ) from exc


# The deadline of the first-result hooks whose answer the host waits for (launches, turn
# reports, terminal messages); the host sets it from its settings.
_answers = DeadlineRunner(timeout_s=1.0)


def hung_plugins() -> dict[str, str]:
    """Plugins whose call of a deadline hook is past its deadline, each with the sentence
    that names it (claim hooks have the host's claim gate's own)."""
    return _answers.hung()


class _OnWaitingThread:
    """An argument whose methods run on the thread that waits for the hook call: a
    `TurnContext` reads and writes through that thread's connection, in its transaction."""

    def __init__(self, target: Any, calls: HookCalls) -> None:
        self._target, self._calls = target, calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        return self._calls.on_waiting_thread(value) if callable(value) else value


def _call_under_deadline(
    hook_name: str, *, again: bool = True, handed_over: frozenset[str] = frozenset(), **kwargs: Any
) -> Any:
    """`_call`, on a helper thread under the hook deadline (the contract's `deadline`).

    The hook is called whole, so wrappers still wrap. A plugin whose call is past the
    deadline is named once in the log and left out until that call returns: with `again`
    the hook is called again without it (an earlier implementation answers, at last the
    built-in); without, its sentence is raised, failing this one operation. The methods
    of the arguments named in `handed_over` run on the waiting thread.
    """
    assert hookspecs.CONTRACTS[hook_name].deadline, f"{hook_name}'s contract has no deadline"
    _check_transaction(hook_name)
    manager = registry().manager
    culprit = functools.partial(_culprit_in_frame, hook_name)

    def job(calls: HookCalls) -> Any:
        arguments = {
            name: _OnWaitingThread(value, calls) if name in handed_over else value
            for name, value in kwargs.items()
        }
        caller = getattr(manager.hook, hook_name)
        hung = [
            impl.plugin for impl in caller.get_hookimpls() if not calls.is_usable(impl.plugin_name)
        ]
        if hung:
            caller = manager.subset_hook_caller(hook_name, hung)
        call = functools.partial(_call_caller, hook_name, caller)
        return calls.call(None, hook_name, call, arguments, culprit)

    try:
        answer, timeouts = _answers.run(job, again=again)
    except HookDeadlineError as error:
        log.error("%s", error)
        raise
    for failure in timeouts:
        log.error("%s", failure)
    return answer


def _call_each(
    hook_name: str, kwargs_for: Callable[[str], dict[str, Any]]
) -> tuple[list[Any], list[PluginError]]:
    """Call every implementation on its own, so one failing plugin cannot starve the rest.

    Implementations run in pluggy's order (last registered first) with the arguments
    `kwargs_for(plugin_name)` builds. Returns the answers, in that order, and the
    failures, each naming its plugin and the hook.
    """
    assert hookspecs.CONTRACTS[hook_name].isolated, f"{hook_name}'s contract is not isolated"
    _check_transaction(hook_name)
    answers, failures = [], []
    caller = getattr(registry().manager.hook, hook_name)
    implementations = list(reversed(caller.get_hookimpls()))
    if registry().tracing:  # each implementation is called directly, past pluggy's monitor
        _trace_call(hook_name, kwargs_for(""), [impl.plugin_name for impl in implementations])
    for impl in implementations:
        kwargs = kwargs_for(impl.plugin_name)
        try:
            answers.append(impl.function(**{name: kwargs[name] for name in impl.argnames}))
        except Exception as exc:
            failure = PluginError(
                f"Plugin {impl.plugin_name!r} failed in hook {hook_name}: "
                f"{type(exc).__name__}: {exc}"
            )
            failure.plugin_name = impl.plugin_name
            failures.append(failure)
    return answers, failures


# The hook deadline of notification hooks; the host sets it from its settings.
_delivery = NotificationDelivery(timeout_s=1.0)


def set_hook_deadline(timeout_s: float) -> None:
    """How long a notification hook call, or one the host waits for, may take before its
    plugin counts as hung."""
    _delivery.timeout_s = timeout_s
    _answers.timeout_s = timeout_s


def drain_notifications(timeout_s: float = EXIT_DRAIN_S) -> bool:
    """Wait until the notifications posted so far reached their plugins (a hung plugin
    counts as reached), at most `timeout_s`; True when they all did."""
    return _delivery.drain(timeout_s)


def _post(hook_name: str, **kwargs: Any) -> None:
    """Hand a notification to each implementation's delivery line (`hook_delivery`):
    never blocks the caller; failures and hangs are logged there, never raised."""
    assert hookspecs.CONTRACTS[hook_name].kind == "notification", hook_name
    _check_transaction(hook_name)
    implementations = list(reversed(getattr(registry().manager.hook, hook_name).get_hookimpls()))
    if registry().tracing:  # delivered past pluggy's monitor
        _trace_call(hook_name, kwargs, [impl.plugin_name for impl in implementations])
    for impl in implementations:
        args = {name: kwargs[name] for name in impl.argnames}
        _delivery.post(impl.plugin_name, Notification(hook_name, impl.function, args))


def is_heard(*hook_names: str) -> bool:
    """True when one of these notification hooks has an implementation or calls are
    traced: work done only to fill in such a notification may be skipped otherwise."""
    reg = registry()
    return reg.tracing or any(
        getattr(reg.manager.hook, name).get_hookimpls() for name in hook_names
    )


def answered_by_builtin_alone(hook_name: str) -> bool:
    """True when one built-in is the hook's only implementation and calls are not traced:
    the core may then act on what that built-in is known to answer without asking it."""
    reg = registry()
    if reg.tracing:
        return False
    implementations = getattr(reg.manager.hook, hook_name).get_hookimpls()
    return len(implementations) == 1 and is_builtin(implementations[0].plugin_name)


def _builtin_answering(hook_name: str) -> str | None:
    return next(
        (name for name in DEFAULT_PLUGINS if hasattr(importlib.import_module(name), hook_name)),
        None,
    )


def _first_result(hook_name: str, **kwargs: Any) -> Any:
    """The answer of a first-result hook; for a required one, no answer is a clear error.
    A hook whose contract has a deadline is called under it unless a built-in answers it
    alone (the host's own code, trusted not to hang, spared the helper thread)."""
    contract = hookspecs.CONTRACTS[hook_name]
    assert contract.kind == "first-result", hook_name
    if contract.deadline and not answered_by_builtin_alone(hook_name):
        answer = _call_under_deadline(hook_name, **kwargs)
    else:
        answer = _call(hook_name, **kwargs)
    if answer is None and contract.required:
        _call_required_failed(hook_name)
    return answer


def _answer(hook_name: str, kind: type[_Answer], **kwargs: Any) -> _Answer:
    """The answer of a required first-result hook, checked to be a `kind`."""
    answer = _first_result(hook_name, **kwargs)
    if not isinstance(answer, kind):
        raise PluginError(f"{hook_name} must return a {kind.__name__}, got {answer!r:.80}.")
    return answer


def _check_transaction(hook_name: str) -> None:
    """Log a core bug when a hook whose contract says `outside` is called inside a
    state-store transaction: its plugins are told they hold no lock."""
    if hookspecs.CONTRACTS[hook_name].transaction == "inside":
        return
    # Looked up, not imported: a process that never opened the store (a worker) has no
    # transaction, and keeps peewee off its import path.
    models = sys.modules.get("pi_workflows.storage.models")
    database = None if models is None else models.database_proxy.obj
    if database is not None and database.in_transaction():
        log.error(
            "pi-workflows bug: %s was called inside a state-store transaction; its contract "
            "says outside",
            hook_name,
        )


def _call_required_failed(hook_name: str) -> NoReturn:
    """Raise the sentence for a required hook that nobody answered."""
    builtin = _builtin_answering(hook_name)
    if builtin in registry().disabled:
        raise UnansweredHookError(
            f"No plugin answers {hook_name}: its built-in {builtin} is disabled by "
            f"{DISABLE_ENV}; remove it from there or install a plugin that implements "
            f"{hook_name}."
        )
    raise UnansweredHookError(
        f"No plugin answered {hook_name} (every implementation returned None); fix the "
        "plugin that overrides it, or disable it."
    )


def open_database(url: str | None, home: Path) -> peewee.Database | None:
    database: peewee.Database | None = _first_result("piw_open_database", url=url, home=home)
    return database


def select_run_to_claim(candidates: list[RunRecord], host: HostInfo) -> RunRecord:
    chosen = _first_result("piw_select_run_to_claim", candidates=candidates, host=host)
    # By position: `is` against the unchecked answer would lose the candidate's type.
    for index, candidate in enumerate(candidates):
        if candidate is chosen:
            return candidates[index]
    raise PluginError(
        "piw_select_run_to_claim returned a run that is not one of its candidates; "
        "return an element of `candidates` or None."
    )


def may_claim(run: Any, host: Any) -> bool:
    return all(answer is not False for answer in _call("piw_may_claim", run=run, host=host))


def claim_hooks_are_builtin() -> bool:
    """True when claiming asks no plugin: the built-in selection answers alone and no
    plugin implements `piw_may_claim` (the host then takes the first candidate in claim
    order, and may do so inside a transaction)."""
    if not answered_by_builtin_alone("piw_select_run_to_claim"):
        return False
    return not registry().manager.hook.piw_may_claim.get_hookimpls()


@dataclass
class ClaimChoice:
    """What the claim hooks said of one candidate window (`choose_runs_to_claim`)."""

    chosen: list[Any] = field(default_factory=list)  # selected and allowed, in order
    vetoed: list[Any] = field(default_factory=list)
    # Plugins that raised or missed their deadline; the choice was made without them.
    failures: list[PluginError] = field(default_factory=list)


def choose_runs_to_claim(
    windows: list[list[Any]], host: Any, wanted: int, runner: DeadlineRunner
) -> ClaimChoice:
    """Ask the claim hooks about candidate windows, in claim order, in one job (SPEC §6).

    In each window, repeatedly: `piw_select_run_to_claim` picks one of the candidates
    left, then every `piw_may_claim` may veto it; until `wanted` runs are chosen or none
    is left. The job goes on to the next window only while nothing was chosen. Each
    implementation is called on its own under the runner's deadline: one that raises, or
    hangs, is left out of the rest of the job (a selection falls back to the next one,
    at last the built-in) and named in `failures`. Call it outside any transaction.
    Raises `UnansweredHookError` when no selection answers at all.
    """
    if registry().tracing:
        caller = registry().manager.hook.piw_select_run_to_claim
        _trace_call(
            "piw_select_run_to_claim",
            {"candidates": windows[0] if windows else [], "host": host},
            [impl.plugin_name for impl in reversed(caller.get_hookimpls())],
        )
    job = _ClaimJob(windows, host, wanted)
    choice, timeouts = runner.run(job.run)
    choice.failures[:0] = timeouts
    return choice


class _ClaimJob:
    """`choose_runs_to_claim`'s work, on the deadline runner's thread."""

    def __init__(self, windows: list[list[Any]], host: Any, wanted: int) -> None:
        caller = registry().manager.hook
        self.selectors = list(reversed(caller.piw_select_run_to_claim.get_hookimpls()))
        self.vetoers = list(reversed(caller.piw_may_claim.get_hookimpls()))
        self.windows, self.host, self.wanted = windows, host, wanted
        # Candidates come in the built-in selection's order (`claim_candidates`): when
        # it answers alone, its answer is the first candidate left, without asking it.
        self.builtin_selects = answered_by_builtin_alone("piw_select_run_to_claim")
        self.tracing = registry().tracing

    def run(self, calls: HookCalls) -> ClaimChoice:
        self.calls, self.choice, self.failed = calls, ClaimChoice(), set[str]()
        for window in self.windows:
            self._choose_in(window)
            if self.choice.chosen:
                break
        return self.choice

    def _choose_in(self, candidates: list[Any]) -> None:
        left = list(candidates)
        while left and len(self.choice.chosen) < self.wanted:
            picked = self._select(left)
            allowed = True
            for impl in self.vetoers:  # every one is asked; any False vetoes
                answered, answer = self._ask(impl, "piw_may_claim", run=picked, host=self.host)
                if answered and answer is False:
                    allowed = False
            del left[next(i for i, run in enumerate(left) if run is picked)]
            (self.choice.chosen if allowed else self.choice.vetoed).append(picked)

    def _select(self, left: list[Any]) -> Any:
        if self.builtin_selects:
            return left[0]
        hook = "piw_select_run_to_claim"
        for impl in self.selectors:
            answered, answer = self._ask(impl, hook, candidates=left, host=self.host)
            if not answered or answer is None:
                continue
            if any(answer is run for run in left):
                return answer
            self._fail(
                impl.plugin_name,
                f"Plugin {impl.plugin_name!r} failed in hook {hook}: it returned a run that "
                "is not one of its candidates; return an element of `candidates` or None.",
            )
        _call_required_failed(hook)

    def _ask(self, impl: Any, hook_name: str, **kwargs: Any) -> tuple[bool, Any]:
        """(answered, answer) of one implementation; a failed or hung one is skipped."""
        name = impl.plugin_name
        if name in self.failed or not self.calls.is_usable(name):
            return False, None
        try:
            args = {arg: kwargs[arg] for arg in impl.argnames}
            answer = self.calls.call(name, hook_name, impl.function, args)
        except Exception as exc:
            if self.tracing:
                _debug_line(f"{hook_name} raised {type(exc).__name__}")
            self._fail(
                name, f"Plugin {name!r} failed in hook {hook_name}: {type(exc).__name__}: {exc}"
            )
            return False, None
        if self.tracing:  # called past pluggy's monitor: the trace says what it returned
            _debug_line(f"{hook_name} returned {_shape(answer)}")
        return True, answer

    def _fail(self, plugin: str, sentence: str) -> None:
        failure = PluginError(sentence)
        failure.plugin_name = plugin
        self.failed.add(plugin)
        self.choice.failures.append(failure)


def run_claimed(run: Any, claim: Any) -> None:
    """Notify `piw_run_claimed` (delivered in order with the other notifications)."""
    _post("piw_run_claimed", run=run, claim=claim)


def worker_run_command(
    record: RunRecord, resume_interaction_attempt_id: str | None
) -> WorkerRunCommand:
    return _answer(
        "piw_worker_run_command",
        WorkerRunCommand,
        record=record,
        resume_interaction_attempt_id=resume_interaction_attempt_id,
    )


def worker_process(envelope: WorkerLaunchEnvelope, settings: WorkerSettings) -> WorkerProcessSpec:
    return _answer("piw_worker_process", WorkerProcessSpec, envelope=envelope, settings=settings)


def adjudicate_turn_report(report: TurnReport, ctx: TurnContext) -> TurnReceipt:
    """The receipt of a turn report, inside the report's transaction. Under the hook
    deadline (unless the built-in answers alone), with `ctx` used on this thread; a
    plugin past the deadline fails this report (the caller's transaction rolls back what
    it wrote) and is left out of later reports until its call returns."""
    hook = "piw_adjudicate_turn_report"
    if answered_by_builtin_alone(hook):
        return _answer(hook, TurnReceipt, report=report, ctx=ctx)
    receipt = _call_under_deadline(
        hook, again=False, handed_over=frozenset({"ctx"}), report=report, ctx=ctx
    )
    if receipt is None:
        _call_required_failed(hook)
    if not isinstance(receipt, TurnReceipt):
        raise PluginError(f"{hook} must return a TurnReceipt, got {receipt!r:.80}.")
    return receipt


def unproductive_turn_limit(run: RunRecord, node_id: str) -> int:
    limit = _first_result("piw_unproductive_turn_limit", run=run, node_id=node_id)
    if type(limit) is not int or limit < 1:
        raise PluginError(
            f"piw_unproductive_turn_limit must return a positive integer, got {limit!r}."
        )
    return limit


def presentation_instructions(run: RunRecord, facts: TerminalFacts) -> str:
    instructions = _first_result("piw_presentation_instructions", run=run, facts=facts)
    if not isinstance(instructions, str):
        raise PluginError(
            f"piw_presentation_instructions must return text, got {instructions!r:.80}."
        )
    return instructions


def render_terminal_message(facts: TerminalFacts, instructions: str) -> MessageContent:
    return _answer(
        "piw_render_terminal_message", MessageContent, facts=facts, instructions=instructions
    )


def step_prompt(contract: StepContract, authored: str) -> str:
    prompt = _first_result("piw_step_prompt", contract=contract, authored=authored)
    if not isinstance(prompt, str) or not prompt.strip():
        raise PluginError(f"piw_step_prompt must return non-empty text, got {prompt!r:.80}.")
    return prompt


def _collect_registrations(hook_name: str, what: str) -> dict[str, Any]:
    """Name → value from every plugin; a failing plugin is logged by name and skipped."""
    collected: dict[str, Any] = {}

    def register(name: str, value: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what} names must be non-empty strings, got {name!r}")
        collected.setdefault(name, value)

    for failure in _call_each(hook_name, lambda _plugin: {"register": register})[1]:
        log.error("%s", failure)
    return collected


def decision_channel_factories() -> dict[str, Any]:
    """Channel kind → factory, from `piw_register_decision_channels`."""
    return _collect_registrations("piw_register_decision_channels", "decision channel")


def channel_gave_up(gave_up: ChannelGaveUp) -> None:
    """Notify `piw_channel_gave_up` (delivered in order with the other notifications)."""
    _post("piw_channel_gave_up", gave_up=gave_up)


def agent_executor_factories() -> dict[str, Any]:
    """Executor name → factory, from `piw_register_agent_executors`."""
    return _collect_registrations("piw_register_agent_executors", "agent executor")


def register_workflows(register_for: Callable[[str], Callable[..., None]]) -> list[PluginError]:
    """Let each plugin register workflows through `register_for(plugin_name)`, a
    `register(name, workflow, revision=...)` that knows who calls it. A failing plugin
    is reported and skipped; the others (built-ins included) still register."""
    return _call_each("piw_register_workflows", lambda plugin: {"register": register_for(plugin)})[
        1
    ]


def is_builtin(plugin_name: str) -> bool:
    return plugin_name in DEFAULT_PLUGINS


def workflow_dirs(project: Path) -> list[Path]:
    """Workflow directories from every plugin, built-ins first; a failing plugin is
    logged by name and skipped."""
    answers, failures = _call_each("piw_workflow_dirs", lambda _plugin: {"project": project})
    for failure in failures:
        log.warning("%s", failure)
    # Answers come last registered first; built-ins must keep precedence.
    return [Path(d) for answer in reversed(answers) if answer for d in answer]


def register_commands(cli: Any) -> list[PluginError]:
    """Let each plugin add commands; a failing plugin is reported and skipped."""
    return _call_each("piw_register_commands", lambda _plugin: {"cli": cli})[1]


def run_transition(
    run_id: str,
    old_status: str | None,
    new_status: str,
    detail: str | None,
    *,
    workflow_name: str,
    at: int,
) -> None:
    _post(
        "piw_run_transition",
        run_id=run_id,
        old_status=old_status,
        new_status=new_status,
        detail=detail,
        workflow_name=workflow_name,
        at=at,
    )


def node_attempts_heard() -> bool:
    """Whether `node_attempt_changed` reaches anyone (a commit then reads its attempts)."""
    return is_heard("piw_node_attempt_started", "piw_node_attempt_finished")


def node_attempt_changed(phase: str, attempt: NodeAttemptRecord) -> None:
    """Notify `piw_node_attempt_started` or `piw_node_attempt_finished` (`phase`)."""
    started = phase == "started"
    _post("piw_node_attempt_started" if started else "piw_node_attempt_finished", attempt=attempt)


def worker_exited(
    run_id: str, outcome: str, exit_code: int | None, signal: int | None, *, at: int
) -> None:
    _post(
        "piw_worker_exited",
        run_id=run_id,
        outcome=outcome,
        exit_code=exit_code,
        signal=signal,
        at=at,
    )
