"""The default model, end to end: what a user sees from `make run` and from --chat, with both builds
(the generic one finding SmolLM2's chat template in its table)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import BUILDS, REPO, run


def test_chat_answers_capital_of_france(default_build):
    r = run(default_build, "--chat", "-p", "What is the capital of France?", "--temp", "0")
    assert "Paris" in r.stdout.decode()


def test_interactive_chat_keeps_the_conversation(default_build):
    """Two turns on stdin (no terminal): the second answer builds on the cached first turn."""
    r = run(default_build, "--chat", "--temp", "0",
            input=b"What is the capital of France?\nAnd what is the capital of Germany?\n")
    answers = r.stdout.decode().strip().split("\n")
    assert "Paris" in answers[0] and "Berlin" in r.stdout.decode()


def test_system_prompt_changes_the_answer(default_build):
    plain = run(default_build, "--chat", "-p", "Who are you?", "--temp", "0", "-n", "24").stdout
    pirate = run(default_build, "--chat", "--system", "You are a pirate named Blackbeard.", "-p", "Who are you?",
                 "--temp", "0", "-n", "24").stdout
    assert plain != pirate


@pytest.mark.parametrize("build", BUILDS)
def test_make_run_without_terminal_answers_sample_question(build):
    r = subprocess.run(["make", "-s", "run", *(["GENERIC=1"] if build == "generic" else [])], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "What is the capital of France?" in r.stdout and "Paris" in r.stdout
