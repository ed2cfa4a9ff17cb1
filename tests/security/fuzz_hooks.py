"""schemathesis hooks for ``test_fuzz.py`` (loaded with ``SCHEMATHESIS_HOOKS``).

The contract forbids a 500 for any request; a 503 (no kernel free, with Retry-After) or a 507
(state directory full) is an answer, not a server error.
"""

from __future__ import annotations

from typing import Any

import schemathesis

ANSWERS = {503, 507}


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> None:
    """Any 5xx but the contract's own answers is a failure."""
    if response.status_code >= 500 and response.status_code not in ANSWERS:
        raise AssertionError(f"server error {response.status_code}: {response.text[:500]}")
