"""A profile added while the host runs (a custom template's): on one machine it serves sessions
at once and is forgotten when removed; a host of nodes without a bundle store refuses to add
one (nothing would carry the template's image to its nodes), and says so."""

from __future__ import annotations

import pytest

from kernel_pool import InvalidRequest, ProfileNotFound, SessionHost


async def test_a_profile_is_added_and_removed_while_running_or_refused(
        host: SessionHost) -> None:
    added = host.profile("default").model_copy(update={"name": "added-1", "min_idle": 0})
    if not host.adds_profiles:
        with pytest.raises(InvalidRequest, match="need a bundle store"):
            host.set_profile(added)
        host.remove_profile("added-1")  # nothing to forget
        with pytest.raises(ProfileNotFound):
            host.profile("added-1")
        return
    host.set_profile(added)
    try:
        assert host.profile("added-1") == added
        made = await host.create_session("added-1", tenant="t-added")
        try:
            assert made.state().profile.name == "added-1"
        finally:
            await host.delete_session(made.id)
    finally:
        host.remove_profile("added-1")
    with pytest.raises(ProfileNotFound):
        host.profile("added-1")
