"""ByteSplatModel training steps on small synthetic views: a model from a seed cloud, its cameras and
targets, one step's loss, gradients and strategy state, and a step taken from a trained state.
The fused-backend tests run them on the CPU (torch stand-in) and on the GPU (the kernels)."""

from __future__ import annotations

import math

import torch


def make_model(rasterizer: str, seed_points, device="cpu", **overrides):
    from nerfstudio.data.scene_box import SceneBox

    from bytesplat_ns.model import ByteSplatModelConfig

    # hw_prune off: it is on by default with the fused backend only, and these tests compare backends
    overrides = {"hw_prune": "off", "num_downscales": 0, "sh_degree": 3, "sh_degree_interval": 2, **overrides}
    cfg = ByteSplatModelConfig(rasterizer=rasterizer, **overrides)
    torch.manual_seed(0)
    # clone: the model's means Parameter aliases the seed points it is given (on CPU), so models
    # built from one cloud would otherwise step each other's Gaussians
    seed_points = tuple(t.clone() for t in seed_points)
    model = cfg.setup(scene_box=SceneBox(aabb=torch.tensor([[-1.0, -1, -1], [1, 1, 1]])), num_train_data=4,
                      metadata={}, seed_points=seed_points)
    return model.to(device)


def make_camera(W=64, H=48, device="cpu"):
    from nerfstudio.cameras.cameras import Cameras

    c2w = torch.tensor([[1.0, 0, 0, 0.05], [0, 1, 0, -0.03], [0, 0, 1, 3.0]])[None]  # looks down -z
    f = 0.9 * W
    return Cameras(camera_to_worlds=c2w, fx=f, fy=f, cx=W / 2, cy=H / 2, width=W, height=H).to(device)


def model_train_step(model, camera, image, step, background, optimizers=None, lr=1e-3):
    """What nerfstudio's Trainer does for one iteration (step_cb, forward, metrics, losses,
    backward, optimizer step, step_post_backward), returning the grads and the updated params."""
    from bytesplat_ns.model import GAUSSIAN_PARAM_NAMES

    model.train()
    if optimizers is None:
        optimizers = {n: torch.optim.Adam([model.gauss_params[n]], lr=lr, eps=1e-15) for n in GAUSSIAN_PARAM_NAMES}
    model.step_cb(type("O", (), {"optimizers": optimizers})(), step)
    model._get_background_color = lambda: background.clone()  # the same "random" background both ways
    for p in model.gauss_params.values():
        p.grad = None
    outputs = model(camera)
    batch = {"image": image}
    metrics = model.get_metrics_dict(outputs, batch)
    losses = model.get_loss_dict(outputs, batch, metrics)
    loss = sum(losses.values())
    loss.backward()
    grads = {n: model.gauss_params[n].grad.detach().clone() for n in GAUSSIAN_PARAM_NAMES}
    before = {n: model.gauss_params[n].detach().clone() for n in GAUSSIAN_PARAM_NAMES}
    for opt in optimizers.values():
        opt.step()
    update = {n: model.gauss_params[n].detach() - before[n] for n in GAUSSIAN_PARAM_NAMES}
    model.step_post_backward(step)
    return dict(loss=float(losses["main_loss"]), psnr=float(metrics["psnr"]), rgb=outputs["rgb"].detach(),
                grads=grads, update=update, state={k: v.clone() for k, v in model.strategy_state.items()
                                                    if isinstance(v, torch.Tensor)})


def copy_model_state(src, dst):
    """dst takes src's Gaussians (any count, after densification) and strategy statistics."""
    for n, p in src.gauss_params.items():
        dst.gauss_params[n] = torch.nn.Parameter(p.detach().clone())
    dst.strategy_state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in src.strategy_state.items()}


def train_views(n=4, W=64, H=48, device="cpu"):
    """n cameras on a small arc, all looking down -z at the origin from about 3 units."""
    from nerfstudio.cameras.cameras import Cameras

    cams = []
    for i in range(n):
        a = (i - (n - 1) / 2) * 0.08
        c2w = torch.tensor([[math.cos(a), 0, math.sin(a), 3.0 * math.sin(a)], [0, 1, 0, 0.02 * i],
                            [-math.sin(a), 0, math.cos(a), 3.0 * math.cos(a)]])[None]
        f = 0.9 * W
        cams.append(Cameras(camera_to_worlds=c2w, fx=f, fy=f, cx=W / 2, cy=H / 2, width=W, height=H).to(device))
    return cams


def seed_cloud(n=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    pts = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([0.9, 0.7, 0.5])
    cols = (torch.rand(n, 3, generator=g) * 255).to(torch.uint8)
    return pts, cols


def anisotropic(model, seed=2):
    """The model's initial Gaussians with random anisotropic scales and some SH detail (isotropic
    seeds give quaternion gradients that are pure rounding noise)."""
    g = torch.Generator().manual_seed(seed)
    params = {n: p.detach().cpu().clone() for n, p in model.gauss_params.items()}
    params["scales"] = params["scales"] + 0.4 * torch.randn(params["scales"].shape, generator=g)
    params["features_rest"] = 0.1 * torch.randn(params["features_rest"].shape, generator=g)
    params["opacities"] = torch.randn(params["opacities"].shape, generator=g)
    return params


def models_from_same_gaussians(seed_points, backends=("fused", "reference"), **overrides):
    """One ByteSplatModel per backend, all starting from the same anisotropic Gaussians. ``fused`` is
    forced on the CPU model (resolve_backend refuses it there; the tests mock its ops)."""
    models, params = {}, None
    for name in backends:
        model = make_model("reference", seed_points, **overrides)
        if name == "fused":
            model._backend = "fused"
        if params is None:
            params = anisotropic(model)
        for n, p in model.gauss_params.items():
            p.data.copy_(params[n])
        models[name] = model
    return models


def target_image(W=64, H=48, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(1, 3, H, W, generator=g)
    return torch.nn.functional.avg_pool2d(img, 5, 1, 2)[0].permute(1, 2, 0).contiguous().to(device)


TRAINED_OVERRIDES = dict(warmup_length=4, refine_every=5, reset_alpha_every=1000, densify_grad_thresh=2e-4)


def step_at_trained_state(device, trainer_backend, backends, force_backend=None, steps=12, lr=1e-2):
    """Train a model for ``steps`` iterations (densifying every 5) on 4 views with ``trainer_backend``,
    then run the next iteration from that exact state once per backend in ``backends``.
    ``force_backend`` maps a backend name to the one to force after construction (CPU: "fused" runs
    with the torch stand-in). Returns {backend: model_train_step result}."""
    from bytesplat_ns.model import GAUSSIAN_PARAM_NAMES

    force_backend = force_backend or {}
    seed_points = seed_cloud()
    views = train_views(device=device)
    images = [target_image(seed=10 + i, device=device) for i in range(len(views))]
    gen = torch.Generator().manual_seed(3)
    bgs = [torch.rand(3, generator=gen).to(device) for _ in range(steps + 1)]

    def build(backend):
        model = make_model("reference" if backend in force_backend else backend, seed_points, device,
                           **TRAINED_OVERRIDES)
        if backend in force_backend:
            model._backend = force_backend[backend]
        return model

    trainer = build(trainer_backend)
    for n, p in anisotropic(trainer).items():
        trainer.gauss_params[n].data.copy_(p.to(device))
    optimizers = {n: torch.optim.Adam([trainer.gauss_params[n]], lr=lr, eps=1e-15) for n in GAUSSIAN_PARAM_NAMES}
    for step in range(steps):
        model_train_step(trainer, views[step % len(views)], images[step % len(views)], step, bgs[step], optimizers)
    assert trainer.num_points > seed_points[0].shape[0]  # densified on the way
    assert steps % TRAINED_OVERRIDES["refine_every"] != 0  # the compared step only accumulates statistics
    out = {}
    for backend in backends:
        model = build(backend)
        copy_model_state(trainer, model)
        out[backend] = model_train_step(model, views[steps % len(views)], images[steps % len(views)], steps, bgs[steps])
    return out
