"""Built-in plugins: the reference behaviour, registered like any third-party plugin."""

DEFAULT_PLUGINS = (
    "pi_workflows.builtin.storage",
    "pi_workflows.builtin.claiming",
    "pi_workflows.builtin.launch",
    "pi_workflows.builtin.turns",
    "pi_workflows.builtin.terminal",
    "pi_workflows.builtin.workflows",
    "pi_workflows.builtin.executors",
    "pi_workflows.builtin.step_prompt",
    "pi_workflows.builtin.decision_channels",
)

# Without these nothing can open state; PI_WORKFLOWS_DISABLE_PLUGINS cannot block them.
ESSENTIAL_PLUGINS = ("pi_workflows.builtin.storage",)
