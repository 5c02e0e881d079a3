"""cProfile of every rank of a torchrun job: `torchrun ... scripts/profile_rank.py OUT_DIR MODULE [ARGS]`
runs `python -m MODULE ARGS` under cProfile; each rank writes OUT_DIR/profile_rank{RANK}.txt (the top
functions by cumulative time, then by own time). Wall time: a function that waits for the GPU or a
peer is charged the wait."""
import cProfile
import io
import os
import pstats
import runpy
import sys

out_dir, module = sys.argv[1], sys.argv[2]
sys.argv = [module] + sys.argv[3:]
profiler = cProfile.Profile()
try:
    profiler.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(50)
    stats.sort_stats("tottime").print_stats(35)
    with open(os.path.join(out_dir, f"profile_rank{os.environ.get('RANK', '0')}.txt"), "w") as fh:
        fh.write(text.getvalue())
