"""The operation table host features register into: wrappers compose in any order."""

from __future__ import annotations

import pytest

from pi_workflows.host.operations import OperationTable
from pi_workflows.host.receipts import OperationResult


def _wrapper(seen: list[str]):
    def wrap(request, proceed):
        seen.append("wrapper")
        if request == "mine":
            return OperationResult("accepted", receipt={"by": "wrapper"})
        return proceed(request)

    return wrap


def _plain(seen: list[str]):
    def plain(request):
        seen.append("plain")
        return OperationResult("accepted", receipt={"by": "plain"})

    return plain


@pytest.mark.parametrize("wrapper_first", [True, False])
def test_a_wrapper_wraps_the_operation_whatever_the_registration_order(wrapper_first: bool):
    seen: list[str] = []
    table = OperationTable()
    steps = [
        lambda: table.wrap_durable("run.resume", _wrapper(seen)),
        lambda: table.register_durable("run.resume", _plain(seen)),
    ]
    for step in steps if wrapper_first else reversed(steps):
        step()
    assert table.durable_handler("run.resume")("mine").receipt == {"by": "wrapper"}
    assert table.durable_handler("run.resume")("other").receipt == {"by": "plain"}
    assert seen == ["wrapper", "wrapper", "plain"]
    assert "run.resume" in table.known
