#!/usr/bin/env python3
"""Reads ob-launch's --metrics stream (varint-delimited ob.pb.Metrics
records, ob-formats(5)) with the standard library only, for the process
tests: the records of completed steps (heartbeats and the master's exit
records are left out). A record still being written at the end of the file
is ignored.

  metrics.py max-step FILE           highest step any rank reported (-1: none)
  metrics.py min-step FILE           lowest step any rank trained (-1: none)
  metrics.py check FILE STEPS RANKS  every step 0..STEPS-1 reported by RANKS
                                     ranks of the last generation that ran it,
                                     all agreeing on the loss; prints the loss
  metrics.py mean FILE FIELD [FROM [by-rank]]
                                     mean of double field number FIELD over
                                     the step records of steps >= FROM
                                     (default 0), every rank's (by-rank: and
                                     each rank's, on stderr)
  metrics.py compare REF RUN [REL]   RUN's loss at every step (from the last
                                     generation that ran it) equals REF's
                                     within REL (default 1e-4) relative
  metrics.py compare-bf16 REF RUN [FIRST [LAST10]]
                                     two bf16 runs of one model from one
                                     start (bf16 training is chaotic: one
                                     run's spike is not the other's): step
                                     0's loss within FIRST (default 1e-3)
                                     relative, the mean of the last ten steps
                                     within LAST10 (default 2e-2); prints
                                     both and the largest step's difference
  metrics.py evals FILE              "STEP LOSS" of every evaluation (the last
                                     generation that ran the step; every
                                     rank must agree)
  metrics.py compare-evals REF RUN [REL]  RUN's evaluations are REF's steps,
                                     each within REL (default 1e-4) relative
  metrics.py wall-step FILE FROM     wall-clock seconds per step from the
                                     end of step FROM to the last (rank 0's
                                     unix_ms, last generation)
  metrics.py max FILE FIELD          the largest value of integer FIELD over
                                     every step record of every rank
  metrics.py hangs FILE              the master's hang records, one line each:
                                     RANK HOST GENERATION STEP STALLED_SECONDS
"""
import struct
import sys

RANK, STEP, GENERATION, UNIX_MS, LOSS, HEARTBEAT, EXIT, HANG, EVAL_LOSS = 3, 6, 7, 8, 13, 17, 26, 30, 44
HOST = 2


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(body, where="record"):
    """A record's fields by number: varints as ints, doubles as floats,
    length-delimited fields as bytes (32-bit fields skipped)."""
    f, j = {}, 0
    while j < len(body):
        key, j = varint(body, j)
        num, wt = key >> 3, key & 7
        if wt == 0:
            f[num], j = varint(body, j)
        elif wt == 1:
            f[num] = struct.unpack("<d", body[j:j + 8])[0]
            j += 8
        elif wt == 2:
            ln, j = varint(body, j)
            f[num] = body[j:j + ln]
            j += ln
        elif wt == 5:
            j += 4
        else:
            raise ValueError(f"{where}: wire type {wt}")
    return f


def frames(data, where="stream"):
    """Every complete record of a stream's bytes, heartbeats and exit
    records included, as (its bytes with the length prefix, its fields)."""
    i = 0
    try:
        while i < len(data):
            n, j = varint(data, i)
            if j + n > len(data):
                return
            yield data[i:j + n], fields(data[j:j + n], where)
            i = j + n
    except IndexError:
        return


def records(path):
    """The records of completed steps (no heartbeats, no exit records)."""
    return [f for _, f in frames(open(path, "rb").read(), path)
            if not f.get(HEARTBEAT) and EXIT not in f]


def final_steps(recs):
    """{step: [(rank, loss)] of the last generation that reported it}."""
    best = {}
    for r in recs:
        step, gen = r.get(STEP, 0), r.get(GENERATION, 0)
        have = best.get(step)
        if have is None or gen > have[0]:
            best[step] = (gen, [])
        if best[step][0] == gen:
            best[step][1].append((r.get(RANK, 0), r.get(LOSS, 0.0)))
    return {s: v[1] for s, v in best.items()}


def losses(recs):
    out = {}
    for step, rl in final_steps(recs).items():
        ls = [l for _, l in rl]
        if max(ls) - min(ls) > 1e-9 * abs(max(ls)):
            raise SystemExit(f"step {step}: ranks disagree on the loss: {rl}")
        out[step] = ls[0]
    return out


def evals(recs):
    """{step: eval loss} from the last generation that ran each step."""
    best = {}
    for r in recs:
        step, gen = r.get(STEP, 0), r.get(GENERATION, 0)
        if gen < best.get(step, (-1, []))[0]:
            continue
        if gen > best.get(step, (-1, []))[0]:
            best[step] = (gen, [])
        if EVAL_LOSS in r:
            best[step][1].append(r[EVAL_LOSS])
    out = {}
    for step, (_, ls) in best.items():
        if not ls:
            continue
        if max(ls) - min(ls) > 1e-9 * abs(max(ls)):
            raise SystemExit(f"step {step}: ranks disagree on the eval loss: {ls}")
        out[step] = ls[0]
    return out


def main(argv):
    cmd = argv[1]
    if cmd == "max-step":
        print(max((r.get(STEP, 0) for r in records(argv[2])), default=-1))
    elif cmd == "min-step":  # of the steps trained (heartbeats and exits do not count)
        print(min(losses(records(argv[2])), default=-1))
    elif cmd == "check":
        steps, ranks = int(argv[3]), int(argv[4])
        final = final_steps(records(argv[2]))
        if sorted(final) != list(range(steps)):
            raise SystemExit(f"steps reported: {sorted(final)[:5]}..{sorted(final)[-5:]}, want 0..{steps - 1}")
        for s, rl in final.items():
            if len(rl) != ranks:
                raise SystemExit(f"step {s}: {len(rl)} reports, want {ranks}: {rl}")
        ls = losses(records(argv[2]))
        print(f"loss {ls[0]:.4f} -> {ls[steps - 1]:.4f}")
    elif cmd == "mean":
        field, first = int(argv[3]), int(argv[4]) if len(argv) > 4 else 0
        recs = [r for r in records(argv[2]) if r.get(STEP, 0) >= first]
        vals = [r.get(field, 0.0) for r in recs]
        if not vals:
            raise SystemExit(f"{argv[2]}: no step records from step {first}")
        print(f"{sum(vals) / len(vals):.6f}")
        if len(argv) > 5 and argv[5] == "by-rank":  # then one line per rank on stderr
            for rank in sorted({r.get(RANK, 0) for r in recs}):
                v = [r.get(field, 0.0) for r in recs if r.get(RANK, 0) == rank]
                print(f"  rank {rank}: {sum(v) / len(v):.6f}", file=sys.stderr)
    elif cmd == "compare":
        rel = float(argv[4]) if len(argv) > 4 else 1e-4
        ref, run = losses(records(argv[2])), losses(records(argv[3]))
        missing = sorted(set(ref) - set(run))
        if missing:
            raise SystemExit(f"steps missing from {argv[3]}: {missing[:10]}")
        worst = max(abs(run[s] - ref[s]) / abs(ref[s]) for s in ref)
        gens = sorted({r.get(GENERATION, 0) for r in records(argv[3])})
        print(f"{len(ref)} steps, generations {gens}, max relative loss difference {worst:.2e}")
        if worst > rel:
            bad = [s for s in sorted(ref) if abs(run[s] - ref[s]) / abs(ref[s]) > rel]
            raise SystemExit(f"losses differ beyond {rel} at steps {bad[:10]}: "
                             f"{[(s, ref[s], run[s]) for s in bad[:3]]}")
    elif cmd == "compare-bf16":
        first = float(argv[4]) if len(argv) > 4 else 1e-3
        last10 = float(argv[5]) if len(argv) > 5 else 2e-2
        ref, run = losses(records(argv[2])), losses(records(argv[3]))
        missing = sorted(set(ref) - set(run))
        if missing or len(ref) < 10 or 0 not in ref:
            raise SystemExit(f"steps missing from {argv[3]}: {missing[:10]} (of {len(ref)})")
        rel = {s: abs(run[s] - ref[s]) / abs(ref[s]) for s in ref}
        tail = sorted(ref)[-10:]
        ma, mb = sum(ref[s] for s in tail) / 10, sum(run[s] for s in tail) / 10
        d10 = abs(mb - ma) / abs(ma)
        worst = max(rel, key=rel.get)
        gens = sorted({r.get(GENERATION, 0) for r in records(argv[3])})
        print(f"{len(ref)} steps, generations {gens}: step 0 {run[0]:.5f} / {ref[0]:.5f} ({rel[0]:.1e}), "
              f"last ten {mb:.4f} / {ma:.4f} ({d10:.1e}), largest step difference {rel[worst]:.1e} (step {worst})")
        if rel[0] > first or d10 > last10:
            raise SystemExit(f"beyond bf16's tolerance: step 0 {rel[0]:.1e} (at most {first}), "
                             f"last ten {d10:.1e} (at most {last10})")
    elif cmd == "evals":
        for step, loss in sorted(evals(records(argv[2])).items()):
            print(step, f"{loss:.6f}")
    elif cmd == "compare-evals":
        rel = float(argv[4]) if len(argv) > 4 else 1e-4
        ref, run = evals(records(argv[2])), evals(records(argv[3]))
        if sorted(ref) != sorted(run) or not ref:
            raise SystemExit(f"evaluated steps differ: {sorted(ref)} vs {sorted(run)}")
        worst = max(abs(run[s] - ref[s]) / abs(ref[s]) for s in ref)
        print(f"{len(ref)} evaluations, max relative difference {worst:.2e}")
        if worst > rel:
            raise SystemExit(f"eval losses differ beyond {rel}: {[(s, ref[s], run[s]) for s in sorted(ref)]}")
    elif cmd == "wall-step":
        first = int(argv[3])
        ends = {}
        for r in records(argv[2]):
            if r.get(RANK, 0) != 0:
                continue
            step, gen = r.get(STEP, 0), r.get(GENERATION, 0)
            if step not in ends or gen >= ends[step][0]:
                ends[step] = (gen, r.get(UNIX_MS, 0))
        last = max(ends, default=-1)
        if first not in ends or last <= first:
            raise SystemExit(f"{argv[2]}: rank 0 reported no steps after {first}")
        print(f"{(ends[last][1] - ends[first][1]) / 1e3 / (last - first):.6f}")
    elif cmd == "max":
        field = int(argv[3])
        print(max((r.get(field, 0) for r in records(argv[2])), default=0))
    elif cmd == "hangs":
        for _, f in frames(open(argv[2], "rb").read(), argv[2]):
            if HANG in f:
                stalled = fields(f[HANG], "hang").get(1, 0.0)
                print(f.get(RANK, 0), f.get(HOST, b"").decode(), f.get(GENERATION, 0),
                      f.get(STEP, 0), f"{stalled:.2f}")
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
