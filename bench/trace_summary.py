#!/usr/bin/python3
"""Where a GPU step's time goes, from Kineto/Chrome traces (ob-launch with
OB_TRACE=DIR, bench/peers/torch_loop.py --trace FILE), side by side.

    bench/trace_summary.py --steps 2 ob=trace-rank-0.json peer=peer.json

For each trace, per traced step: the window from the first to the last GPU
activity, the time the GPU was busy (the union of kernels, copies and
sets over all streams) and idle, the kernels' time by kind (matrix
products, attention, optimizer, copies, ...), the host's CUDA runtime calls
(launches), and the kernels that took longest in total. A trace may be
gzip-compressed (.gz).

Where the compute stream (the stream with the most kernel time) waits
for the host: each of its gaps of at least 10 us is charged to the
innermost "ob::" range (the worker's RECORD_USER_SCOPE phases: ob::forward,
ob::update, ...) under way on the host when the stream ran dry, and to the
CUDA runtime call under way then (a synchronisation shows as
cudaStreamSynchronize and the like; none: the host was busy elsewhere).
"""

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import defaultdict

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

# First match wins; names are CUDA kernel names, lower-cased.
KINDS = [
    ("nccl", r"nccl"),
    ("optimizer", r"adam|multi_tensor|foreach|fused_sgd"),
    ("attention", r"flash|fmha|attention|sdpa|efficient_attention"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|sm90_|sm80_|cublas|matmul|splitk"),
    ("layernorm", r"layer_norm|layernorm"),
    ("softmax/loss", r"softmax|nll_loss|cross_entropy|log_softmax"),
    ("embedding", r"embedding|index_put|indexing_backward|index_select|sort|radix|unique|segment"),
    ("reduce", r"reduce|sum_kernel|norm_kernel"),
    ("copy/cast", r"memcpy|copy|cast|to_copy|convert"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|add|mul|fill"),
]


def kind_of(name, cat):
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    low = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


MIN_GAP_US = 10.0


def gaps_between(spans):
    """(start, length) of each stretch with no activity between the first
    and the last of the (start, end) spans."""
    out, end = [], None
    for s, e in sorted(spans):
        if end is not None and s > end:
            out.append((end, s - end))
        end = e if end is None else max(end, e)
    return out


class Ranges:
    """Host ranges (start, end, name) by thread; ranges of one thread nest
    or follow each other, as a thread's calls do."""

    def __init__(self):
        self.by_thread = defaultdict(list)

    def add(self, thread, start, end, name):
        self.by_thread[thread].append((start, end, name))

    def freeze(self):
        for rs in self.by_thread.values():
            rs.sort()
        self.starts = {t: [r[0] for r in rs] for t, rs in self.by_thread.items()}

    def innermost(self, t, lookback=2000):
        """The name of the shortest range containing time t, or None. Per
        thread, the innermost is the latest-starting range that still lasts
        at t; an enclosing one started earlier (looked for among the
        `lookback` ranges before)."""
        best = None
        for thread, rs in self.by_thread.items():
            i = bisect.bisect_right(self.starts[thread], t) - 1
            for j in range(i, max(-1, i - lookback), -1):
                s, e, name = rs[j]
                if e >= t:
                    if best is None or e - s < best[1] - best[0]:
                        best = (s, e, name)
                    break
        return best[2] if best else None


def compute_stream_gaps(gpu_events, phases, runtime):
    """Idle time of the busiest stream, charged to host phases and calls."""
    by_stream = defaultdict(float)
    for s, e, _, cat, stream in gpu_events:
        if cat == "kernel":
            by_stream[stream] += e - s
    if not by_stream:
        return 0.0, {}, {}
    main = max(by_stream, key=by_stream.get)
    idle, by_phase, by_call = 0.0, defaultdict(float), defaultdict(float)
    for start, gap in gaps_between((s, e) for s, e, _, _, stream in gpu_events if stream == main):
        if gap >= MIN_GAP_US:
            idle += gap
            by_phase[phases.innermost(start) or "(no ob:: range)"] += gap
            by_call[runtime.innermost(start) or "(no CUDA call)"] += gap
    return idle, by_phase, by_call


def summarize(path, steps):
    events = load(path)
    gpu, launches, cpu_ops = [], 0, 0  # gpu: (start, end, name, cat, stream)
    phases, runtime = Ranges(), Ranges()
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        ts, dur = float(ev.get("ts", 0)), float(ev.get("dur", 0))
        if cat in GPU_CATS:
            args = ev.get("args") or {}
            gpu.append((ts, ts + dur, ev.get("name", "?"), cat, args.get("stream", ev.get("tid"))))
        elif cat == "cuda_runtime":
            runtime.add((ev.get("pid"), ev.get("tid")), ts, ts + dur, ev.get("name", "?"))
            if re.search(r"launch", ev.get("name", ""), re.I):
                launches += 1
        elif cat == "cpu_op":
            cpu_ops += 1
        elif cat == "user_annotation" and ev.get("name", "").startswith("ob::"):
            phases.add((ev.get("pid"), ev.get("tid")), ts, ts + dur, ev["name"])
    if not gpu:
        return None
    window = max(e for _, e, _, _, _ in gpu) - min(s for s, _, _, _, _ in gpu)
    busy = union_length([(s, e) for s, e, _, _, _ in gpu])
    by_kind = defaultdict(float)
    by_name = defaultdict(lambda: [0.0, 0])
    for s, e, name, cat, _ in gpu:
        by_kind[kind_of(name, cat)] += e - s
        entry = by_name[name]
        entry[0] += e - s
        entry[1] += 1
    gaps = [gap for _, gap in gaps_between((s, e) for s, e, _, _, _ in gpu)]
    n = float(steps)
    phases.freeze()
    runtime.freeze()
    idle_main, by_phase, by_call = compute_stream_gaps(gpu, phases, runtime)
    return {
        "compute_idle_ms": idle_main / 1e3 / n,
        "idle_by_phase_ms": {k: v / 1e3 / n for k, v in by_phase.items()},
        "idle_by_call_ms": {k: v / 1e3 / n for k, v in by_call.items()},
        "window_ms": window / 1e3 / n,
        "busy_ms": busy / 1e3 / n,
        "idle_ms": (window - busy) / 1e3 / n,
        "gaps_over_100us_ms": sum(g for g in gaps if g > 100) / 1e3 / n,
        "gaps_over_100us": sum(1 for g in gaps if g > 100) / n,
        "kernel_sum_ms": sum(by_kind.values()) / 1e3 / n,
        "gpu_activities": len(gpu) / n,
        "launches": launches / n,
        "cpu_ops": cpu_ops / n,
        "by_kind_ms": {k: v / 1e3 / n for k, v in by_kind.items()},
        "top": sorted(((v[0] / 1e3 / n, v[1] / n, name) for name, v in by_name.items()), reverse=True),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="steps in each trace (figures are per step)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default="", help="write the summaries here too")
    ap.add_argument("traces", nargs="+", help="LABEL=PATH")
    a = ap.parse_args()
    sums = {}
    for item in a.traces:
        label, _, path = item.partition("=")
        if not path:
            sys.exit(f"trace_summary: '{item}': expected LABEL=PATH")
        try:
            s = summarize(path, a.steps)
        except (OSError, ValueError, KeyError) as e:
            print(f"trace_summary: {path}: {e}", file=sys.stderr)
            continue
        if s is None:
            print(f"trace_summary: {path}: no GPU activity in the trace", file=sys.stderr)
            continue
        sums[label] = s
    if not sums:
        sys.exit(1)
    labels = list(sums)
    row = lambda name, vals: print(f"{name:<26}" + "".join(f"{v:>14}" for v in vals))
    print(f"per step (traces of {a.steps} steps)")
    row("", labels)
    for key, fmt in (("window_ms", "{:.2f}"), ("busy_ms", "{:.2f}"), ("idle_ms", "{:.2f}"),
                     ("compute_idle_ms", "{:.2f}"),
                     ("gaps_over_100us_ms", "{:.2f}"), ("gaps_over_100us", "{:.0f}"),
                     ("kernel_sum_ms", "{:.2f}"), ("gpu_activities", "{:.0f}"), ("launches", "{:.0f}"),
                     ("cpu_ops", "{:.0f}")):
        row(key, [fmt.format(sums[l][key]) for l in labels])
    kinds = sorted({k for s in sums.values() for k in s["by_kind_ms"]},
                   key=lambda k: -max(s["by_kind_ms"].get(k, 0) for s in sums.values()))
    print("kernel time by kind (ms/step)")
    for k in kinds:
        row("  " + k, [f"{sums[l]['by_kind_ms'].get(k, 0):.2f}" for l in labels])
    for key, title in (("idle_by_phase_ms", "compute stream idle (gaps >= 10 us) by host phase (ms/step)"),
                       ("idle_by_call_ms", "compute stream idle by the CUDA call under way on the host (ms/step)")):
        names = sorted({k for s in sums.values() for k in s[key]},
                       key=lambda k: -max(s[key].get(k, 0) for s in sums.values()))
        print(title)
        for k in names[: a.top]:
            row("  " + k[:24], [f"{sums[l][key].get(k, 0):.2f}" for l in labels])
    for l in labels:
        print(f"top kernels, {l} (ms/step, launches/step, name)")
        for ms, count, name in sums[l]["top"][: a.top]:
            print(f"  {ms:9.3f} {count:7.1f}  {name[:150]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({l: {k: v for k, v in s.items() if k != "top"} | {"top": s["top"][:100]}
                       for l, s in sums.items()}, f, indent=1)


if __name__ == "__main__":
    main()
