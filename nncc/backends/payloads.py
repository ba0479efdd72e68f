"""Making a plan's backend payloads ready to run when the plan is loaded.

Each payload goes to the backend that made it, when that backend is registered in this
process (nothing is imported because a plan names it); otherwise its partitions run their
portable instructions. A payload that is machine code (the backend says so, or the plan
stored it as code) is executable: it runs only when it was verified and comes from someone
the user trusts. Code nncc just built, or read from its own cache after the hash check, is
trusted (``trusted``); an artifact's code is the artifact maker's, so it runs only when the
artifact is signed by a key the user trusts (nncc.trust) or the caller says so
(``--trust-native``). Whenever a payload does not run, one warning line says why.
"""

from __future__ import annotations

from typing import Any

from nncc.backends.registry import loaded_backend
from nncc.plan.plan import Plan
from nncc.util.notice import warn


def activate_payloads(plan: Plan, trusted: bool, origin: str = "the artifact",
                      team_key_file: str | None = None) -> dict[str, Any]:
    """Backend name -> what its ``activate`` made of its payload (absent: run portably).
    ``team_key_file``: the team key the command trusts beside the user's own."""
    loaded: dict[str, Any] = {}
    verdict = None
    for name, payload in sorted(plan.payloads.items()):
        backend = loaded_backend(name)
        if backend is None:
            continue
        if (payload.code or backend.payload_is_code) and not trusted:
            if verdict is None:
                from nncc.trust.seal import check  # lazy: start-up

                verdict = check(plan.seal, team_key_file)
            if not verdict.trusted:
                warn(f"{origin} carries {backend.code_noun}, but {verdict.reason}; running its portable plan "
                     f"({verdict.remedy})")
                continue
        state = backend.activate(payload, plan, origin)
        if state is not None:
            loaded[name] = state
    return loaded
