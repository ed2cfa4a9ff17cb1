"""E2B's code interpreter in every language of the default image, through E2B's Python SDK
against a real gateway: per-call ``envs`` over the sandbox's own, contexts made with a ``cwd``,
and the results R and JavaScript give ``execution.text``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox

pytestmark = pytest.mark.usefixtures("e2b_env")

LANGUAGES = ["python", "bash", "r", "javascript", "typescript", "java"]
READ = {"python": "import os; print(os.environ.get('{name}', 'unset'))",
        "bash": 'echo "${{{name}-unset}}"',
        "r": "cat(Sys.getenv('{name}', unset = 'unset'), '\\n', sep = '')",
        "javascript": "console.log(process.env.{name} ?? 'unset')",
        "typescript": "console.log((process.env.{name} ?? 'unset') as string)",
        "java": 'System.out.println(System.getProperty("{name}", "unset"))'}
"""Code that prints the variable ``name`` as E2B's tests read it (Java: its property)."""
TRICKY = "it's \"quoted\" \\ $(not run) `nor this` %s {} \\u0041\nsecond line"
WHERE = {"python": "import os; print(os.getcwd())", "bash": "pwd",
         "r": "cat(getwd(), '\\n', sep = '')", "javascript": "console.log(process.cwd())",
         "typescript": "console.log(Deno.cwd() as string)",
         "java": 'System.out.println(System.getProperty("user.dir"))'}


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(envs={"TEST_ENV_VAR": "supertest"})
    yield sandbox
    sandbox.kill()


def _read(sandbox: Sandbox, language: str, name: str, **envs: str) -> str:
    execution = sandbox.run_code(READ[language].format(name=name), language=language,
                                 envs=envs or None)
    assert execution.error is None, execution.error
    return "".join(execution.logs.stdout).removesuffix("\n")


@pytest.mark.parametrize("language", LANGUAGES)
def test_envs_hold_for_one_call_in_every_language(sandbox: Sandbox, language: str) -> None:
    assert _read(sandbox, language, "FOO", FOO="bar") == "bar"
    assert _read(sandbox, language, "FOO") == "unset"
    # a value with quotes, backslashes, shell syntax and a newline is that value, never code
    assert _read(sandbox, language, "FOO", FOO=TRICKY) == TRICKY
    assert _read(sandbox, language, "FOO") == "unset"


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_sandboxs_envs_reach_every_language_and_come_back_after_a_call(
        sandbox: Sandbox, language: str) -> None:
    assert _read(sandbox, language, "TEST_ENV_VAR") == "supertest"
    assert _read(sandbox, language, "TEST_ENV_VAR", TEST_ENV_VAR="overwrite") == "overwrite"
    assert _read(sandbox, language, "TEST_ENV_VAR") == "supertest"


def test_a_name_no_kernel_can_set_is_refused_with_a_sentence(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="not letters, digits and underscores"):
        sandbox.run_code("1", language="bash", envs={"A-B; rm -rf /": "x"})


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_context_made_with_a_cwd_runs_there(e2b_env: dict[str, str], language: str) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.make_dir("/home/user/a project")
        context = sandbox.create_code_context(language=language, cwd="/home/user/a project")
        assert context.cwd == "/home/user/a project"
        listed = {c.id: c for c in sandbox.list_code_contexts()}
        assert listed[context.id].cwd == context.cwd
        here = sandbox.run_code(WHERE[language], context=context)
        assert "".join(here.logs.stdout) == "/home/user/a project\n", here
        default = sandbox.run_code(WHERE[language], language=language)
        assert "".join(default.logs.stdout) == "/home/user\n", default
        with pytest.raises(SandboxException, match="does not exist in the sandbox"):
            sandbox.create_code_context(language=language, cwd="/home/user/nowhere")
    finally:
        sandbox.kill()


def test_r_and_javascript_last_values_are_the_executions_text(sandbox: Sandbox) -> None:
    assert sandbox.run_code("x <- c(1, 2, 3); mean(x)", language="r").text == "[1] 2"
    assert sandbox.run_code("print('a'); 'b'", language="r").text == '[1] "b"'
    assert sandbox.run_code("1 + 1", language="js").text == "2"
    assert sandbox.run_code("'Hello World!'", language="javascript").text == "Hello World!"
    assert sandbox.run_code("const n: number = 3; n * 2", language="ts").text == "6"


def test_java_output_comes_as_e2bs_java_kernel_sends_it(sandbox: Sandbox) -> None:
    # E2B's IJava sends a println's text and its line break apart (its own suite reads
    # logs.stdout[0] as the line); Python's output stays as the kernel sent it.
    java = sandbox.run_code('System.out.println("Hello, World!"); System.out.print("a\\nb")',
                            language="java")
    assert java.error is None, java.error
    assert java.logs.stdout == ["Hello, World!", "\n", "a", "\n", "b"]
    python = sandbox.run_code("print('Hello, World!')")
    assert python.logs.stdout == ["Hello, World!\n"]
