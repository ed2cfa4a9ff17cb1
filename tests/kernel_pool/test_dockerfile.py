"""A Dockerfile read as the engine's builder numbers its steps: each instruction with the line it
starts on (comments, blank lines, continuations, the escape directive)."""

from __future__ import annotations

from kernel_pool.backends.docker._dockerfile import (
    Instruction,
    escape_of,
    parse_dockerfile,
    render_dockerfile,
)


def test_each_instruction_keeps_the_line_it_starts_on() -> None:
    text = ("# syntax=docker/dockerfile:1\n"
            "ARG BASE=x\n"
            "\n"
            "FROM ${BASE} AS build\n"
            "# a comment\n"
            "RUN one \\\n"
            "  # a comment inside, dropped\n"
            "  && two\n"
            "copy a b\n")
    found = parse_dockerfile(text)
    assert [(i.keyword, i.line) for i in found] == [
        ("ARG", 2), ("FROM", 4), ("RUN", 6), ("COPY", 9)]
    assert found[2].text == "RUN one \n  && two"
    assert parse_dockerfile(render_dockerfile(found))[2].text == found[2].text


def test_the_escape_directive_changes_the_continuation() -> None:
    text = "# escape=`\nFROM x\nRUN a `\n  b\n"
    assert escape_of(text) == "`"
    found = parse_dockerfile(text)
    assert [(i.keyword, i.line) for i in found] == [("FROM", 2), ("RUN", 3)]
    rendered = render_dockerfile([*found, Instruction(keyword="COPY", text="COPY x /")], "`")
    assert rendered.startswith("# escape=`\n") and "RUN a `\n  b\nCOPY x /\n" in rendered


def test_a_last_line_continued_into_nothing_is_still_a_step() -> None:
    assert [(i.keyword, i.line) for i in parse_dockerfile("FROM x\nRUN a \\\n")] == [
        ("FROM", 1), ("RUN", 2)]
