"""The default model, end to end: what a user sees from `make run` and from --chat."""

from __future__ import annotations

import subprocess

from conftest import REPO, run


def test_chat_answers_capital_of_france(default_binary):
    r = run(default_binary, "--chat", "-p", "What is the capital of France?", "--temp", "0")
    assert "Paris" in r.stdout.decode()


def test_interactive_chat_keeps_the_conversation(default_binary):
    """Two turns on stdin (no terminal): the second answer builds on the cached first turn."""
    r = run(default_binary, "--chat", "--temp", "0",
            input=b"What is the capital of France?\nAnd what is the capital of Germany?\n")
    answers = r.stdout.decode().strip().split("\n")
    assert "Paris" in answers[0] and "Berlin" in r.stdout.decode()


def test_system_prompt_changes_the_answer(default_binary):
    plain = run(default_binary, "--chat", "-p", "Who are you?", "--temp", "0", "-n", "24").stdout
    pirate = run(default_binary, "--chat", "--system", "You are a pirate named Blackbeard.", "-p", "Who are you?",
                 "--temp", "0", "-n", "24").stdout
    assert plain != pirate


def test_make_run_without_terminal_answers_sample_question():
    r = subprocess.run(["make", "-s", "run"], cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "What is the capital of France?" in r.stdout and "Paris" in r.stdout
