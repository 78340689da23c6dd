"""A refund desk of a model agent and a plain one, written into a test's folder and recorded
by ``pantheon run`` against the scenario's own stand-in model (a real local ModelServer the
run starts): what ``pantheon trace`` and the dashboard's Trace tab are tested on.

The ``refunds`` ModelAgent looks an order up (``order_status``, which raises for an unknown
order: the error goes back to the model), asks the refund limit (``refund_limit``) and
answers a checked ``Verdict``; ``payout`` asks a person before paying more than 50 and pays
through the recorded ``tool.pay``. Tickets: T-1 (delivered: no refund), T-2 (lost: a
refund of 95.5, approved by the scripted person ``desk-lead``), T-3 (an unknown order; its
label expects a refund, so the team is wrong about it).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from cli_run import pantheon

from pantheon.sessions import SessionStore

__all__ = ["recorded_refunds", "write_refunds"]

MODULE = '''
"""The refund desk's tools, answer type, scripted model and payout agent."""

import json
from typing import Literal

from pydantic import BaseModel

from pantheon.testing import Reply

ORDERS = {"A-1": {"status": "delivered", "paid": 40.0}, "A-2": {"status": "lost", "paid": 95.5}}


class Verdict(BaseModel):
    action: Literal["refund", "none"]
    amount: float
    reason: str


def order_status(order_id: str) -> dict:
    """The shipping status of an order and what was paid for it.

    Args:
        order_id: The order number, e.g. "A-1".
    """
    if order_id not in ORDERS:
        raise LookupError(f"no order {order_id}")
    return {"order_id": order_id, **ORDERS[order_id]}


async def refund_limit(status: str, paid: float) -> float:
    """How much may be refunded for an order in this state.

    Args:
        status: The order's shipping status.
        paid: What the customer paid.
    """
    return paid if status == "lost" else 0.0


def reply(request):
    """Look the order up, ask the limit, decide; an order that is not found is no refund."""
    messages = request["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    order = prompt.split(":")[0].removeprefix("Order ")
    if not results:
        return Reply(tool_calls=[{"name": "order_status", "arguments": {"order_id": order}}])
    if results[0].startswith("Error"):
        return {"action": "none", "amount": 0.0, "reason": f"{order} not found"}
    found = json.loads(results[0])
    if len(results) == 1:
        limit = {"status": found["status"], "paid": found["paid"]}
        return Reply(tool_calls=[{"name": "refund_limit", "arguments": limit}])
    amount = json.loads(results[1])
    action = "refund" if amount else "none"
    return {"action": action, "amount": amount, "reason": f"{order} is {found['status']}"}


def _pay(ticket, amount):
    return {"paid": amount, "transfer": f"TR-{ticket}"}


async def pay(env, agent):
    """Pays a refund; a person approves any over 50 first."""
    p = env.payload
    if p["action"] != "refund":
        return
    if p["amount"] > 50:
        summary = f"refund {p['amount']:.2f} for {p['ticket']}"
        decision = await agent.approve({"summary": summary, "ticket": p["ticket"]})
        if not decision.approved:
            return
    done = await agent.effect("tool.pay", _pay, p["ticket"], p["amount"])
    await agent.emit("refund.paid", {"ticket": p["ticket"], **done})
'''

SCENARIO = """\
version: 1
name: refund-trace
input:
  kind: jsonl
  path: asks.jsonl
  topic: refund.asked
  key: ticket
  label: expected
agents:
  refunds:
    class: "agents:ModelAgent"
    subscribe: [refund.asked]
    settings:
      instructions: "You decide refunds for {customer}. Look the order up first."
      prompt: "Order {order}: {text}"
      tools: ["refund_trace:order_status", "refund_trace:refund_limit"]
      output: "refund_trace:Verdict"
      output_topic: refund.decided
      carry: [ticket]
  payout:
    handler: "refund_trace:pay"
    subscribe: [refund.decided]
provider:
  kind: openai
  model: stand-in
  stand_in: "refund_trace:reply"
outcome:
  topics: [refund.decided]
  key: ticket
  fields: [action]
approvals:
  timeout: 60
  default: reject
  poll: 0.05
  auto: {approve_after: 0.1, note: receipt seen, by: desk-lead}
expect:
  zero_lost: true
  max_dlq: 0
"""

ASKS = [
    {"ticket": "T-1", "customer": "Ada", "order": "A-1", "text": "Never came", "expected": "none"},
    {"ticket": "T-2", "customer": "Bo", "order": "A-2", "text": "Lost?", "expected": "refund"},
    {"ticket": "T-3", "customer": "Cy", "order": "A-9", "text": "Refund me", "expected": "refund"},
]


def write_refunds(folder: Path) -> Path:
    """The team's folder (module, asks, scenario); returns the scenario's path."""
    (folder / "refund_trace.py").write_text(textwrap.dedent(MODULE).lstrip())
    (folder / "asks.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ASKS))
    path = folder / "refunds.yaml"
    path.write_text(SCENARIO)
    return path


def recorded_refunds(folder: Path) -> tuple[Path, str]:
    """One ``pantheon run`` of the desk recorded in ``folder``: the store and the session."""
    scenario = write_refunds(folder)
    store = folder / "sessions.db"
    done = pantheon("run", str(scenario), "--store", str(store), "--json", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    with SessionStore(store, create=False) as st:
        return store, st.sessions()[0].id
