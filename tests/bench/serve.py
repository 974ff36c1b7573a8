"""`ingot --serve` against the binary's own numbers: decode speed through the API (one streaming
client) against --bench, and the time to the first token of a conversation's fifth turn with the
prompt cache and without it (--no-prompt-cache), both servers running side by side and asked in
turn so that they share the machine's state.

    .venv/bin/python tests/bench/serve.py [--binary build/<model>/ingot] [--repeats 5] [-- ingot flags]

Prints a table and one JSON line. Client times are from sending the request to reading the event;
the server's own (its "timings") are beside them: "feeding" is the time the server spent feeding the
prompt's tokens that its cache did not hold, so "TTFT - feeding" is everything else before the first
token (the first sampling step, HTTP, JSON, the client). --bench decodes over the same positions as
the API's answer (from the depth of its prompt): a deeper context reads more of the KV cache a token.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
TURNS = [
    "Hi! I am planning a trip to Italy next spring.",
    "Which three cities should I visit first?",
    "How many days should I spend in each of them?",
    "What food should I try there?",
    "Summarize the plan in two sentences.",
]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def start(argv: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*argv, "--serve", "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = proc.stderr.readline().decode()
    m = re.search(r"on (http://\S+)/ ", line)
    if not m:
        raise SystemExit(f"the server did not start: {line}")
    return proc, m.group(1)


def stream(url: str, path: str, body: dict) -> dict:
    """One streamed request: client time to the first text, to the last, the text, the usage and timings."""
    t0 = time.perf_counter()
    first = last = None
    text, usage, timings = "", None, None
    with requests.post(url + path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                       stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            ev = json.loads(line[6:])
            usage = ev.get("usage") or usage
            timings = ev.get("timings") or timings
            if ev["choices"]:
                c = ev["choices"][0]
                piece = c["delta"].get("content") if "delta" in c else c.get("text")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text += piece
    if first is None:
        raise SystemExit(f"serve.py: {path} streamed no text (usage {usage}): a model whose tokens decode to nothing")
    return {"ttft_s": first - t0, "last_s": last - t0, "text": text, "usage": usage, "timings": timings}


def conversation(url: str, answer_tokens: int) -> dict:
    """Turns 1-4 (greedy answers kept), then the fifth, streamed: its measurements."""
    messages = [{"role": "system", "content": "You are a helpful travel assistant."}]
    for turn in TURNS[:-1]:
        messages.append({"role": "user", "content": turn})
        r = requests.post(url + "/v1/chat/completions", timeout=600,
                          json={"messages": messages, "temperature": 0, "max_tokens": answer_tokens}).json()
        messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
    messages.append({"role": "user", "content": TURNS[-1]})
    return stream(url, "/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 8})


def bench_decode(binary: list[str], n: int, depth: int) -> float:
    """--bench's decode tok/s over the positions the API's answer took: n tokens from depth"""
    out = subprocess.run([*binary, "--bench", "-n", str(n), "--bench-depths", str(depth), "--json"], capture_output=True,
                         check=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["decode"][0]["tok_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=str(REPO / "build" / "smollm2-135m-instruct" / "ingot"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--answer-tokens", type=int, default=48, help="tokens of each of turns 1-4's answers")
    p.add_argument("--only", choices=["ttft", "decode"], help="one of the two measurements")
    p.add_argument("flags", nargs="*", help="ingot flags for every run (after --), e.g. --device cpu --threads 2")
    a = p.parse_args()
    base = [a.binary, *a.flags]

    cached, cached_url = start(base)
    fresh, fresh_url = start([*base, "--no-prompt-cache"])
    rows = {"cache": [], "no_cache": []}
    api_tok_s, api_server_tok_s, bench_tok_s = [], [], []
    try:
        for _ in range(a.repeats if a.only != "decode" else 0):
            rows["cache"].append(conversation(cached_url, a.answer_tokens))
            rows["no_cache"].append(conversation(fresh_url, a.answer_tokens))
        fresh.terminate()
        fresh.wait()
        for _ in range(a.repeats if a.only != "ttft" else 0):  # decode: the API and --bench in turn
            r = stream(cached_url, "/v1/completions", {"prompt": COUNTING, "max_tokens": a.decode_tokens, "temperature": 0})
            n = r["usage"]["completion_tokens"]
            api_tok_s.append((n - 1) / (r["last_s"] - r["ttft_s"]))
            api_server_tok_s.append(r["timings"]["decode_tok_s"])
            bench_tok_s.append(bench_decode(base, a.decode_tokens, r["usage"]["prompt_tokens"]))
    finally:
        for proc in (cached, fresh):
            if proc.poll() is None:
                proc.terminate()
                proc.wait()

    med = statistics.median
    result = {}
    if a.only != "decode":
        ttft_table(rows, a, result)
    if a.only != "ttft":
        print(f"decode, {a.decode_tokens} tokens, median of {a.repeats}: API (client) {med(api_tok_s):.1f} tok/s, "
              f"API (server) {med(api_server_tok_s):.1f} tok/s, --bench {med(bench_tok_s):.1f} tok/s: "
              f"API / bench = {med(api_tok_s) / med(bench_tok_s):.3f}")
        result["decode"] = {"api_client_tok_s": med(api_tok_s), "api_server_tok_s": med(api_server_tok_s),
                            "bench_tok_s": med(bench_tok_s), "all_api": api_tok_s, "all_bench": bench_tok_s}
    print(json.dumps(result))


def ttft_table(rows: dict, a, result: dict) -> None:
    med = statistics.median
    print(f"fifth turn of a conversation, median of {a.repeats} ({a.binary} {' '.join(a.flags)}):")
    print(f"  {'':10} {'prompt tokens':>13} {'fed':>5} {'feeding ms':>11} {'client TTFT ms':>15} {'TTFT - feeding':>15}")
    for mode, rs in rows.items():
        fed = med(r["timings"]["prompt_tokens_fed"] for r in rs)
        ttft = med(r["ttft_s"] for r in rs) * 1e3
        feeding = med(r["timings"]["prompt_ms"] for r in rs)
        over = med(r["ttft_s"] * 1e3 - r["timings"]["prompt_ms"] for r in rs)
        print(f"  {mode:10} {rs[0]['usage']['prompt_tokens']:13d} {fed:5.0f} {feeding:11.1f} {ttft:15.1f} {over:15.1f}")
        result[mode] = {"prompt_tokens": rs[0]["usage"]["prompt_tokens"], "fed": fed, "feeding_ms": feeding,
                        "client_ttft_ms": ttft, "ttft_minus_feeding_ms": over}
    same = all(c["text"] == f["text"] for c, f in zip(rows["cache"], rows["no_cache"]))
    print(f"  the fifth answers with and without the cache are {'the same' if same else 'DIFFERENT'}")
    result["same_answers"] = same


if __name__ == "__main__":
    main()
