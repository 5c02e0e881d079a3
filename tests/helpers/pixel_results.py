"""The pixel-exchange workers' results (tests/helpers/pixel_worker.py) beside their one-process oracle:
the same views rendered by one process, and the ranks' pieces gathered back into whole tensors."""

from __future__ import annotations

import torch

from tests.helpers import pixel_worker as P


def describe(results) -> str:
    return "\n".join(f"--- rank {r.rank}: exit {r.returncode} after {r.seconds:.1f}s\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}" for r in results)


def oracle(g):
    """Single process: composited images [B,H,W,3], loss and parameter gradients of all Gaussians."""
    from bytesplat_ns.distributed import single_process_loss
    from bytesplat_ns.distributed.step import gaussian_colors, rgb_with_background
    from bytesplat_ns.raster import rasterize

    torch.set_num_threads(1)
    views = P.make_views()
    params = {k: torch.nn.Parameter(v.clone()) for k, v in g.items()}
    loss, _ = single_process_loss(params, views, P.SH_DEGREE)
    loss.backward()
    with torch.no_grad():
        r, a, _ = rasterize(params["means"], params["quats"], torch.exp(params["scales"]), torch.sigmoid(params["opacities"]).squeeze(-1),
                            gaussian_colors(params, P.SH_DEGREE), views.viewmats, views.Ks, P.WIDTH, P.HEIGHT, backend="reference", sh_degree=P.SH_DEGREE)
    images = torch.stack([rgb_with_background(r[v], a[v], views.backgrounds[v]) for v in range(P.NUM_VIEWS)])
    return images, float(loss.item()), {k: p.grad for k, p in params.items()}


def gathered(ranks, key):
    """Composited images of every view (from its compositing rank), loss, full gradients in global order."""
    runs_ = [r[key] for r in ranks]
    images = {}
    for run in runs_:
        for v, img in run["renders"].items():
            assert v not in images, "a view composited twice"
            images[v] = img
    assert sorted(images) == list(range(P.NUM_VIEWS))
    imgs = torch.stack([images[v] for v in range(P.NUM_VIEWS)])
    loss = sum(run["loss"] for run in runs_)
    gids = torch.cat([run["gids"] for run in runs_])
    order = torch.argsort(gids)
    assert torch.equal(gids[order], torch.arange(gids.numel())), "every Gaussian on exactly one rank"
    grads = {k: torch.cat([run["grads"][k] for run in runs_])[order] for k in runs_[0]["grads"]}
    return imgs, loss, grads
