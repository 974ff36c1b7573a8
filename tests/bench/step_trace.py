"""Reads the trace of one decode step (a binary built with EXTRA_NVCCFLAGS=-DINGOT_TRACE, run with
INGOT_TRACE_FILE=PATH) and prints, per stage and averaged over the layers but the first, when its
blocks started, had done their work before the wait (first weight loads issued, norm weights
staged: "ready"), passed their wait, had their input staged and finished, in microseconds after the
previous stage's last block finished; with --config, each stage's weight bytes over its time.

    python3 tests/bench/step_trace.py PATH [--config MODEL_DIR/config.json]
"""

import argparse
import json
import sys

import numpy as np

STAGES = ["embed", "qkv", "attention", "o_proj", "gate_up", "down", "lm_head", "mlp"]  # mlp: the fused MLP (MLP_FUSED)
ENTERED, WAITED, STAGED, DONE, READY = range(5)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    n_layers, n_stages, stamps = (int(v) for v in np.frombuffer(data, np.int32, 3))
    if stamps != 5:
        sys.exit(f"step_trace.py: {path}: {stamps} stamps a block, this reader knows 5 (rebuild with -DINGOT_TRACE)")
    counts = np.frombuffer(data, np.uint32, n_stages, 12).astype(np.int64)
    off, recs = 12 + 4 * n_stages, []
    for n in counts:
        recs.append(np.frombuffer(data, np.uint64, stamps * int(n), off).reshape(-1, stamps).astype(np.int64))
        off += 8 * stamps * int(n)
    return int(n_layers), recs


def weight_bytes(cfg):
    dim, hidden = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim", dim // heads)
    return {"qkv": 2 * dim * (heads + 2 * kv) * hd, "o_proj": 2 * heads * hd * dim, "gate_up": 4 * dim * hidden,
            "down": 2 * hidden * dim, "lm_head": 2 * dim * cfg["vocab_size"], "mlp": 6 * dim * hidden}


def summarize(n_layers, recs):
    """{stage: (means over layers 1..L-1 of: start min, median, max; waited min, max; staged median,
    max; done median, p90, max; blocks; ready median, max)}, times in us after the previous stage's last block was done,
    and the step's span in us (first QKV block's start to the last block's end)."""
    seq = []  # (layer, stage, records), in launch order
    fused = len(recs) > 7 and len(recs[7]) > 0  # a layer's MLP in one kernel: QKV, attention, o_proj, mlp
    stages = [1, 2, 3, 7] if fused else list(range(1, 6))
    for st in stages:
        # attention (stage 2, after QKV) may leave none: a probe build without it (docs/performance.md, D55)
        if len(recs[st]) == 0 and st != 2:
            sys.exit(f"step_trace.py: no records of {STAGES[st]}: was the binary built with -DINGOT_TRACE?")
    for layer in range(n_layers):
        for st in stages:
            r = recs[st]
            per = len(r) // n_layers
            if per:
                seq.append((layer, st, r[layer * per:(layer + 1) * per]))
    if len(recs[6]):
        seq.append((n_layers, 6, recs[6]))
    rows = {}
    for i in range(1, len(seq)):
        layer, st, r = seq[i]
        if layer == 0:
            continue
        prev_end = seq[i - 1][2][:, DONE].max()
        rel = (r - prev_end) / 1e3
        done = rel[:, DONE]
        rows.setdefault(st, []).append([rel[:, ENTERED].min(), np.median(rel[:, ENTERED]), rel[:, ENTERED].max(),
                                        rel[:, WAITED].min(), rel[:, WAITED].max(), np.median(rel[:, STAGED]),
                                        rel[:, STAGED].max(), np.median(done), np.percentile(done, 90), done.max(),
                                        len(r), np.median(rel[:, READY]), rel[:, READY].max()])
    span = (seq[-1][2][:, DONE].max() - seq[0][2][:, ENTERED].min()) / 1e3
    return {st: np.mean(np.array(v), axis=0) for st, v in rows.items()}, span


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--config")
    args = ap.parse_args()
    n_layers, recs = read(args.path)
    bytes_of = weight_bytes(json.load(open(args.config))) if args.config else {}
    rows, span = summarize(n_layers, recs)
    hdr = ("stage", "blocks", "enter min", "med", "max", "ready med", "max", "waited min", "max", "staged med", "max",
           "done med", "p90", "max", "GB/s")
    print("us after the previous stage's last block finished, mean over layers 1..%d" % (n_layers - 1))
    print("%-10s %6s | %9s %6s %6s | %9s %6s | %10s %6s | %10s %6s | %8s %6s %6s | %6s" % hdr)
    for st in sorted(rows):
        m = rows[st]
        b = bytes_of.get(STAGES[st])
        gbs = "%6.0f" % (b / (m[9] * 1e3)) if b else "%6s" % "-"
        print("%-10s %6d | %9.2f %6.2f %6.2f | %9.2f %6.2f | %10.2f %6.2f | %10.2f %6.2f | %8.2f %6.2f %6.2f | %s"
              % (STAGES[st], m[10], *m[:3], m[11], m[12], *m[3:10], gbs))
    print("step: %.1f us from the first QKV block's start to the last block's end" % span)


if __name__ == "__main__":
    main()
