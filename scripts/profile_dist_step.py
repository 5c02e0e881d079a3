"""torch.profiler on every rank of `bytesplat-bench distributed`'s measured step (record exchange),
to see where a two-rank step loses against one rank: `torchrun --nproc-per-node R
scripts/profile_dist_step.py OUT_DIR N VIEWS COMMUNICATOR`. Each rank writes
OUT_DIR/profile_dist_R{R}_rank{RANK}.txt: wall ms per step, the GPU's busy ms per step (kernels and
copies, overlaps merged) and the ops by self device time, then by self CPU time; and its trace with
Python frames, OUT_DIR/trace_R{R}_rank{RANK}.json.gz (scripts/trace_gaps.py finds where the GPU
waits on the host in it)."""
import gzip
import shutil
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from bytesplat_ns.bench import distributed as bd
from bytesplat_ns.distributed import assign_views, make_communicator
from bytesplat_ns.distributed.sharding import ShardLayout

out_dir, N, B, comm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", local)
scene = bd.make_scene(N, 1920, 1080, B, 3, 0)
params = bd._leaves(scene["params"], slice(*ShardLayout.even(N, world).range(rank)), device)
views = bd._views(scene, device, assign_views(B, world)[rank])
step = bd._bytesplat_step(params, bd._adam(params, B), views, make_communicator(comm, None), 3, False, "fused")
for _ in range(3):
    step()
torch.cuda.synchronize()
dist.barrier()
steps = 5
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
busy, cur_s, cur_e = 0.0, None, None
for s, e in spans:  # merge overlapping device intervals (us)
    if cur_e is None or s > cur_e:
        busy += 0 if cur_e is None else cur_e - cur_s
        cur_s, cur_e = s, e
    else:
        cur_e = max(cur_e, e)
busy += 0 if cur_e is None else cur_e - cur_s
table = prof.key_averages()
with open(os.path.join(out_dir, f"profile_dist_R{world}_rank{rank}.txt"), "w") as fh:
    fh.write(f"N={N} B={B} {comm} world={world} rank={rank}: wall {1000 * wall:.2f} ms/step, "
             f"GPU busy {busy / 1000 / steps:.2f} ms/step\n\n")
    fh.write(table.table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=60))
    fh.write("\n\n")
    fh.write(table.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
trace = os.path.join(out_dir, f"trace_R{world}_rank{rank}.json")
prof.export_chrome_trace(trace)
with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.remove(trace)
print(f"rank {rank}: wall {1000 * wall:.2f} ms/step, GPU busy {busy / 1000 / steps:.2f} ms/step", flush=True)
dist.destroy_process_group()
