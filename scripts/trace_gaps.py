"""Where the GPU waits on the host, from a torch.profiler trace with Python frames
(scripts/profile_dist_step.py writes them): `python scripts/trace_gaps.py TRACE.json[.gz] [MIN_US]`.

The GPU's busy intervals (kernels, copies, memsets; overlaps merged) leave idle gaps. For each gap of
at least MIN_US (default 20) it takes what the host thread that launches the work was doing while
the GPU sat idle: the innermost frame of bytesplat_ns / the scripts, and whether the host was
waiting on the device itself (cudaStreamSynchronize, a blocking copy) or busy in Python.
Prints the idle time per step summed by that frame, the largest gaps, and totals."""
import collections
import gzip
import json
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def merged(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def ours(name):
    return ("bytesplat_ns" in name or "scripts/" in name) and "<built-in" not in name


def main(path, min_us=20.0):
    ev = [e for e in load(path) if e.get("ph") == "X"]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    busy = merged(gpu)
    # the launching thread: the one with the most runtime calls
    launch_tids = collections.Counter(e["tid"] for e in ev if e.get("cat") == "cuda_runtime")
    tid = launch_tids.most_common(1)[0][0]
    frames = sorted((e for e in ev if e["tid"] == tid and e.get("cat") == "python_function"), key=lambda e: e["ts"])
    runtime = sorted((e for e in ev if e["tid"] == tid and e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    steps = sum(1 for e in frames if e["name"].endswith("): step") and "bench/distributed.py" in e["name"]) or 1

    def host_at(t0, t1):
        """(innermost of our frames covering the gap's middle, waited on the device?)"""
        mid = 0.5 * (t0 + t1)
        inner = None
        for e in frames:
            if e["ts"] > mid:
                break
            if e["ts"] + e["dur"] >= mid and ours(e["name"]):
                if inner is None or e["dur"] <= inner["dur"]:
                    inner = e
        wait = any(r["ts"] <= mid <= r["ts"] + r["dur"] and ("Synchronize" in r["name"] or "Memcpy" in r["name"])
                   for r in runtime)
        return (inner["name"] if inner else "(outside our frames)"), wait

    by_frame = collections.Counter()
    gaps = []
    for (s0, e0), (s1, _) in zip(busy, busy[1:]):
        g = s1 - e0
        if g < min_us:
            continue
        where, wait = host_at(e0, s1)
        key = ("WAIT " if wait else "host ") + where
        by_frame[key] += g
        gaps.append((g, key, e0))
    span = busy[-1][1] - busy[0][0]
    total_busy = sum(e - s for s, e in busy)
    print(f"{path}: {steps} steps; GPU busy {total_busy / steps / 1000:.2f} ms/step of a "
          f"{span / steps / 1000:.2f} ms/step span; idle gaps >= {min_us:.0f} us: "
          f"{sum(g for g, _, _ in gaps) / steps / 1000:.2f} ms/step")
    print("idle ms per step, by what the host was doing:")
    for key, us in by_frame.most_common(25):
        print(f"  {us / steps / 1000:7.3f}  {key}")
    print("largest gaps (us, host, offset from the first kernel in ms):")
    for g, key, t in sorted(gaps, reverse=True)[:15]:
        print(f"  {g:8.1f}  {key}  @{(t - busy[0][0]) / 1000:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 20.0)
