"""Paired timing of ONNX models against a reference model, in a process without torch.

Used by ``latency_repeatability.py`` as the independent check of the latency predictor (the
issue's design): each model is timed in short windows alternated with the largest SubNet and
the reference kernel, so that the machine's drift, which moves all three alike over seconds,
cancels in their ratios. ``pruning_alignment.py`` uses it too, the unpruned model as both
references. Only numpy and onnxruntime are imported.

    python benchmarks/paired_timing.py SPEC.json OUT.json

SPEC: ``{"threads": 1, "rounds": 5, "calls": 15, "warmup": 3, "reference": PATH, "largest":
PATH, "models": {NAME: PATH, ...}}`` (one input each; a dynamic dimension runs at 1). OUT: per model, the
median over rounds of its window median (``ms``), of the reference kernel's and the largest's
window medians read in the same rounds (``reference_ms``, ``largest_ms``), the median ratio to
the largest (``ratio``) and the spread of that ratio over rounds (``ratio_mad``: median absolute
deviation relative to the ratio). Written after every model: a rerun skips those already in OUT.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def session(path: str, threads: int):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    x = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in x.shape]  # a dynamic batch: 1
    feed = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    return lambda: sess.run(None, feed)


def window(run, calls: int, warmup: int) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out_path = Path(sys.argv[2])
    done = json.loads(out_path.read_text()) if out_path.is_file() else {}
    assert "torch" not in sys.modules
    threads, rounds, calls, warmup = spec["threads"], spec["rounds"], spec["calls"], spec["warmup"]
    reference, largest = session(spec["reference"], threads), session(spec["largest"], threads)
    for name, path in spec["models"].items():
        if name in done:
            continue
        run = session(path, threads)
        ms, ref, big, ratios = [], [], [], []
        for r in range(rounds):
            # alternate the order so that neither side always runs right after the other
            order = [("m", run), ("l", largest), ("r", reference)] if r % 2 == 0 else \
                [("r", reference), ("l", largest), ("m", run)]
            got = {k: window(f, calls, warmup) for k, f in order}
            ms.append(got["m"])
            big.append(got["l"])
            ref.append(got["r"])
            ratios.append(got["m"] / got["l"])
        ratio = statistics.median(ratios)
        done[name] = {"ms": statistics.median(ms), "reference_ms": statistics.median(ref),
                      "largest_ms": statistics.median(big), "ratio": ratio,
                      "ratio_mad": statistics.median(abs(x - ratio) for x in ratios) / ratio,
                      "largest_window_ms": big}
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(done))
        os.replace(tmp, out_path)


if __name__ == "__main__":
    main()
