"""Which model a `pi` will answer with, checked against the models Pi says it can use.

Pi itself only warns about a `--model` it does not know and then sends the name to the
provider as a custom model id, so a misspelt `PI_WORKFLOWS_PI_MODEL` would otherwise run
(or fail much later, on the provider's terms). Both the headless executor and `pi doctor`
ask a running pi (RPC `get_state` and `get_available_models`) and judge its answers here.
"""

from __future__ import annotations

from typing import Any

from pi_workflows.plugin import AgentExecutorError, setting_value

MODEL_ENV = "PI_WORKFLOWS_PI_MODEL"
# How many of Pi's models an unknown-model error names before pointing at --list-models.
NAMED_MODELS = 5


def model_name(model: dict[str, Any]) -> str:
    """`provider/id` of a Pi model object."""
    return f"{model.get('provider')}/{model.get('id')}"


def known_model(state_model: Any, available: list[dict[str, Any]], requested: str | None) -> dict:
    """The model pi is set to (`get_state`'s), if Pi can use it; else AgentExecutorError
    with one line naming the model and what to do.

    `available` is `get_available_models` (the models with a configured key); `requested`
    is what pi was asked for with `--model`, None for Pi's default.
    """
    # With no model configured, Pi reports a placeholder (`unknown/unknown`) rather than none.
    if (
        not isinstance(state_model, dict)
        or not state_model.get("id")
        or not (requested or available)
    ):
        raise AgentExecutorError(
            f"pi has no model to use: set {MODEL_ENV} (e.g. provider/model) or "
            "defaultProvider/defaultModel in Pi's settings.json."
        )
    name = model_name(state_model)
    names = [model_name(model) for model in available if isinstance(model, dict)]
    if name in names:
        return state_model
    origin = f"{MODEL_ENV}={requested}" if requested else "Pi's default model"
    provider = str(state_model.get("provider"))
    same_provider = [n for n in names if n.startswith(f"{provider}/")]
    if same_provider:
        listed = ", ".join(same_provider[:NAMED_MODELS])
        more = ", …" if len(same_provider) > NAMED_MODELS else ""
        hint = f"provider {provider} has {listed}{more}"
    else:
        hint = (
            f"Pi has no usable provider {provider!r} (not in models.json, or no API key in "
            "auth.json or its environment variable)"
        )
    raise AgentExecutorError(
        f"Pi does not know the model {name} ({origin}): {hint}; "
        "`pi --list-models` lists the models Pi can use."
    )


def requested_model() -> str | None:
    """The `pi_model` setting (`PI_WORKFLOWS_PI_MODEL`, else `config set pi_model`), or None
    for Pi's default."""
    return str(setting_value("pi_model") or "").strip() or None
