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


@schemathesis.hook
def flatmap_path_parameters(ctx: Any, path_parameters: dict[str, Any] | None) -> Any:
    """Half the time, name the real session (``REPLGATE_FUZZ_SESSION``) instead of a random
    id, so fuzzed bodies reach a live sandbox and not only the 404 path."""
    import os

    from hypothesis import strategies

    real = os.environ.get("REPLGATE_FUZZ_SESSION")
    names = [n for n in ("session_id", "kernel_id") if path_parameters and n in path_parameters]
    if not real or not names or path_parameters is None:
        return strategies.just(path_parameters)
    return strategies.sampled_from(
        [path_parameters, {**path_parameters, **dict.fromkeys(names, real)}])
