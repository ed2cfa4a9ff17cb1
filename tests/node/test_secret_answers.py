"""A gateway's answers to its nodes' questions for secrets (:mod:`node.secret_answers`), from a
real store and the gateway's sealed secrets: a value only for a session the asking node runs
whose rules name the secret; a sentence, never a value, for anything else."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from common.store import SessionRecord
from gateway.secrets import Secrets
from gateway.store import Store
from kernel_pool import NetworkPolicy
from node.secret_answers import SecretAnswers
from node.wire import SecretAnswer, SecretAsk

VALUE = "sk-answer-0123456789abcdef"
POLICY = NetworkPolicy.model_validate({
    "default": "deny", "allow": ["api.example.com"],
    "rules": [{"host": "api.example.com", "headers": {"Authorization": "Bearer {secret:KEY}"},
               "secrets": ["ALSO"]}]})


@pytest.fixture
async def answers() -> AsyncIterator[SecretAnswers]:
    folder = Path(tempfile.mkdtemp(prefix="rg-sa-"))
    try:
        async with Store.open(folder / "replgate.db") as store:
            vault = Secrets(store, SecretStr(base64.b64encode(os.urandom(32)).decode()))
            for tenant in ("acme", "other"):
                await vault.put(tenant, "KEY", f"{VALUE}-{tenant}")
                await vault.put(tenant, "UNNAMED", "sk-never-asked")
            await store.create_session(SessionRecord(id="s1", tenant="acme", profile="default",
                                                     node="n1", epoch=1, network=POLICY))
            await store.create_session(SessionRecord(id="s2", tenant="acme", profile="default",
                                                     node="n1", epoch=1))
            yield SecretAnswers(store, vault.lookup_for)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _ask(answers: SecretAnswers, node: str, session: str, name: str) -> SecretAnswer:
    return await answers.answer(node, SecretAsk(ask=7, session_id=session, name=name))


async def test_a_node_gets_the_value_its_sessions_rule_names(answers: SecretAnswers) -> None:
    answer = await _ask(answers, "n1", "s1", "KEY")
    assert (answer.ask, answer.value, answer.refused) == (7, f"{VALUE}-acme", None)
    assert VALUE not in repr(answer)
    # named by the rule's secrets, but never stored: no value, and no refusal
    assert (await _ask(answers, "n1", "s1", "ALSO")) == SecretAnswer(ask=7)


async def test_a_node_gets_no_secret_of_another_nodes_session_nor_an_unnamed_one(
        answers: SecretAnswers) -> None:
    for node, session, name, why in (
            ("n2", "s1", "KEY", "session s1 does not run on node n2"),
            ("n1", "s1", "UNNAMED", "no rule of session s1 names the secret 'UNNAMED'"),
            ("n1", "s2", "KEY", "no rule of session s2 names the secret 'KEY'"),
            ("n1", "gone", "KEY", "session gone does not run on node n1")):
        answer = await _ask(answers, node, session, name)
        assert answer.value is None and answer.refused == why, (node, session, name)


async def test_a_deleted_session_and_a_gateway_without_secrets_answer_no_value(
        answers: SecretAnswers) -> None:
    await answers.store.mark_deleted("s1")
    assert (await _ask(answers, "n1", "s1", "KEY")).refused == \
        "session s1 does not run on node n1"
    answers.source = None
    assert (await _ask(answers, "n1", "s1", "KEY")).refused == \
        "secrets are not enabled on the gateway (REPLGATE_SECRETS_KEY)"
