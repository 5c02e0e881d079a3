"""One gloo rank of the link probe test: probes, writes its estimate to OUT/<rank>.json."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path


def probe_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from bytesplat_ns.distributed.link_probe import probe_link

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        estimate = probe_link(sizes=(1 << 12, 1 << 18), repeats=2)
        Path(out, f"{rank}.json").write_text(json.dumps(dataclasses.asdict(estimate)))
    finally:
        dist.destroy_process_group()
