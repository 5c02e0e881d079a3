"""Every behaviour switch is a config field: it shows in the CLI's --help, lands in the run's
config.yml, and a non-default value reaches the code it switches (spied at the call)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from bytesplat_ns.raster.options import FusedOptions, FusedRasterConfig
from tests.helpers.cli import tool
from tests.helpers.concurrent_jobs import run_jobs

FUSED_FLAGS = ["--pipeline.model.fused.schedule", "one_launch", "--pipeline.model.fused.warp-cull", "False",
               "--pipeline.model.fused.bwd-reduce", "shuffle", "--pipeline.model.fused.projection", "torch",
               "--pipeline.model.fused.binning", "torch", "--pipeline.model.fused.tile-reach", "cuda",
               "--pipeline.model.fused.fast-exp", "False", "--pipeline.model.fused.check-every", "7"]
FUSED_SET = FusedOptions(schedule="one_launch", warp_cull=False, bwd_reduce="shuffle", projection="torch",
                         binning="torch", tile_reach="cuda", fast_exp=False)
OTHER_FLAGS = ["--optimizers.means.optimizer.implementation", "torch-fused"]
DATAPARSER_FLAGS = ["bytesplat-scene", "--scene-workers", "3"]  # nerfstudio: the dataparser is a subcommand
SHARDED_FLAGS = ["--pipeline.rank-timeout", "123", "--pipeline.sparse-kernels", "False"]


def _parse(argv):
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion

    return tyro.cli(AnnotatedBaseConfigUnion, args=argv)


def _written_config(config, tmp_path):
    """config.yml as ns-train writes it (nerfstudio's scripts/train.py: set_timestamp, save_config)."""
    config.output_dir = tmp_path
    config.set_timestamp()
    config.save_config()
    text = (config.get_base_dir() / "config.yml").read_text()
    return text, yaml.load(text, Loader=yaml.Loader)


def test_switches_land_in_config_yml(tmp_path):
    text, loaded = _written_config(_parse(["bytesplat", *FUSED_FLAGS, *OTHER_FLAGS, *DATAPARSER_FLAGS]), tmp_path / "a")
    assert "FusedRasterConfig" in text and "implementation: torch-fused" in text and "scene_workers" in text
    fused = loaded.pipeline.model.fused
    assert isinstance(fused, FusedRasterConfig) and fused.options() == FUSED_SET and fused.check_every == 7
    assert loaded.optimizers["means"]["optimizer"].implementation == "torch-fused"
    assert loaded.optimizers["scales"]["optimizer"].implementation == "bytesplat"  # only the group asked for
    assert loaded.pipeline.datamanager.dataparser.scene_workers == 3
    _, defaults = _written_config(_parse(["bytesplat"]), tmp_path / "b")
    assert defaults.pipeline.model.fused.options() == FusedOptions() and defaults.pipeline.model.fused.check_every == 0
    # the two-pixel backward needs the butterfly reduction, so it is set apart from FUSED_FLAGS' shuffle
    _, two = _written_config(_parse(["bytesplat", "--pipeline.model.fused.bwd-pixels-per-thread", "2"]), tmp_path / "d")
    assert two.pipeline.model.fused.options() == FusedOptions(bwd_pixels_per_thread=2)

    _, sharded = _written_config(_parse(["bytesplat-distributed", *SHARDED_FLAGS]), tmp_path / "c")
    assert sharded.pipeline.rank_timeout == 123.0 and sharded.pipeline.sparse_kernels is False


@pytest.mark.slow
def test_switches_show_in_ns_train_help():
    """``ns-train bytesplat --help`` (and its dataparser's, and bytesplat-distributed's) list every switch."""
    helps = run_jobs({  # four processes that each spend their time importing: side by side
        "bytesplat": lambda: subprocess.run([tool("ns-train"), "bytesplat", "--help"], capture_output=True, text=True,
                                            timeout=300),
        "scene": lambda: subprocess.run([tool("ns-train"), "bytesplat", "bytesplat-scene", "--help"],
                                        capture_output=True, text=True, timeout=300),
        "distributed": lambda: subprocess.run([tool("ns-train"), "bytesplat-distributed", "--help"],
                                              capture_output=True, text=True, timeout=300),
        "module": lambda: subprocess.run([sys.executable, "-m", "bytesplat_ns.train", "bytesplat-distributed", "--help"],
                                         capture_output=True, text=True, timeout=300),
    })
    out = helps["bytesplat"]
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in FUSED_FLAGS[::2] + OTHER_FLAGS[::2]:
        assert flag in out.stdout, flag
    out = helps["scene"]
    assert out.returncode == 0 and DATAPARSER_FLAGS[1] in out.stdout, out.stderr[-2000:]
    out = helps["distributed"]
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in SHARDED_FLAGS[::2]:
        assert flag in out.stdout, flag
    out = helps["module"]
    assert out.returncode == 0 and "--pipeline.rank-timeout" in out.stdout, out.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# A non-default value reaches the code it switches
# ---------------------------------------------------------------------------------------------


class Reached(Exception):
    """Raised by a spy once it has seen the call."""


def _tiny_model(fused: FusedRasterConfig):
    from nerfstudio.cameras.cameras import Cameras, CameraType
    from nerfstudio.data.scene_box import SceneBox

    from bytesplat_ns.model import ByteSplatModelConfig

    g = torch.Generator().manual_seed(0)
    points = (torch.rand(64, 3, generator=g) - 0.5) * 0.5
    colors = torch.randint(0, 255, (64, 3), generator=g, dtype=torch.uint8)
    config = ByteSplatModelConfig(rasterizer="reference", fused=fused, hw_prune="off", num_downscales=0, sh_degree=0)
    model = config.setup(scene_box=SceneBox(aabb=torch.tensor([[-1.0, -1, -1], [1, 1, 1]])), num_train_data=4,
                         metadata={}, seed_points=(points, colors))
    model._backend = "fused"  # resolve_backend refuses it on the CPU; the spies stop before any kernel
    c2w = torch.tensor([[[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 2.0]]])
    camera = Cameras(camera_to_worlds=c2w, fx=40.0, fy=40.0, cx=24.0, cy=16.0, width=48, height=32,
                     camera_type=CameraType.PERSPECTIVE)
    return model, camera


def test_fused_config_reaches_the_kernels_front_end(monkeypatch):
    """The model hands its ``fused`` config to the front end: FusedOptions to ``rasterize`` (eval,
    viewer) and to ``fused_render_loss`` (training), and check_every to the cross-check."""
    from bytesplat_ns import model as model_module
    from bytesplat_ns.raster import diagnostics, fused

    seen = {}

    def spy(name):
        def record(*args, **kwargs):
            seen[name] = kwargs
            raise Reached(name)

        return record

    monkeypatch.setattr(model_module, "rasterize", spy("rasterize"))
    monkeypatch.setattr(fused, "fused_render_loss", spy("fused_render_loss"))
    monkeypatch.setattr(diagnostics, "compare_with_unfused", spy("compare_with_unfused"))
    model, camera = _tiny_model(FusedRasterConfig(schedule="one_launch", warp_cull=False, bwd_reduce="shuffle",
                                                  projection="torch", binning="torch", tile_reach="cuda",
                                                  fast_exp=False))
    model.eval()
    with pytest.raises(Reached, match="rasterize"), torch.no_grad():
        model.get_outputs(camera)
    assert seen["rasterize"]["fused_options"] == FUSED_SET and seen["rasterize"]["backend"] == "fused"

    model.train()
    model.step_cb(type("O", (), {"optimizers": {}})(), 5)
    batch = {"image": torch.rand(32, 48, 3)}
    with pytest.raises(Reached, match="fused_render_loss"):
        model.get_metrics_dict(model.get_outputs(camera), batch)
    assert seen["fused_render_loss"]["options"] == FUSED_SET
    assert "compare_with_unfused" not in seen  # check_every 0: off

    model.config.fused.check_every = 5  # step 5: a multiple
    with pytest.raises(Reached, match="compare_with_unfused"):
        model.get_metrics_dict(model.get_outputs(camera), batch)
    assert seen["compare_with_unfused"]["options"] == FUSED_SET


def test_adam_implementation_switch_reaches_adam(monkeypatch):
    from bytesplat_ns import optim
    from bytesplat_ns.optim import DeviceAdam, DeviceAdamOptimizerConfig

    asked = []
    original = torch.optim.Adam.__init__

    def record(self, params, **kwargs):
        asked.append(kwargs.pop("fused", None))
        original(self, params, **kwargs)

    monkeypatch.setattr(optim, "_all_on_cuda", lambda params: True)  # as if the parameters were on a GPU
    monkeypatch.setattr(torch.optim.Adam, "__init__", record)
    built = []
    for implementation in ("bytesplat", "torch-fused", "torch"):
        config = DeviceAdamOptimizerConfig(lr=0.1, eps=1e-15, implementation=implementation)
        opt = config.setup([torch.nn.Parameter(torch.zeros(3))])
        assert type(opt) is DeviceAdam and "implementation" not in opt.defaults
        built.append(opt.implementation)
    assert asked == [True, True, None] and built == ["bytesplat", "torch-fused", "torch"]


def test_sparse_kernels_switch_reaches_the_communicator(monkeypatch):
    from bytesplat_ns.distributed import make_communicator, sparse_kernels

    encoded = []
    monkeypatch.setattr(sparse_kernels, "usable", lambda tensor: True)  # as if the kernels were built here
    monkeypatch.setattr(sparse_kernels, "encode", lambda grad: encoded.append(grad) or (None, None))
    grad = torch.tensor([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]])
    index, values = make_communicator("sparse-grad", sparse_kernels=False).encode(grad)
    assert encoded == [] and index.tolist() == [1] and torch.equal(values, grad[1:2])
    make_communicator("sparse-grad").encode(grad)
    assert len(encoded) == 1


def test_rank_timeout_reaches_the_process_group(monkeypatch):
    from bytesplat_ns import train
    from bytesplat_ns.distributed import runtime

    config = train.parse(["bytesplat-distributed", "--pipeline.rank-timeout", "42", "--machine.device-type", "cpu"])
    seen = {}

    def init(backend=None, timeout_s=runtime.DEFAULT_TIMEOUT_S):
        seen.update(backend=backend, timeout_s=timeout_s)
        raise Reached("init_distributed")

    monkeypatch.setattr(runtime, "launched_distributed", lambda: True)
    monkeypatch.setattr(runtime, "init_distributed", init)
    with pytest.raises(Reached):
        train.run(config)
    assert seen == {"backend": "gloo", "timeout_s": 42.0}
    monkeypatch.undo()
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(key, value)
    with pytest.raises(runtime.DistributedError, match="positive"):  # refused before any rendezvous
        runtime.init_distributed("gloo", timeout_s=0)


def test_scene_workers_reach_the_scene_generator(monkeypatch):
    from bytesplat_ns.data import dataparser, scene
    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    seen = {}

    def ensure(spec, cache_dir=None, workers=None):
        seen["workers"] = workers
        raise Reached("ensure_scene")

    monkeypatch.setattr(dataparser, "ensure_scene", ensure)
    parser = BytesplatSceneDataParserConfig(scene_workers=3).setup()
    with pytest.raises(Reached):
        parser.resolve_data()
    assert seen == {"workers": 3}
    assert scene._num_workers(scene.SceneSpec(), 3) == 3 and scene._num_workers(scene.SceneSpec()) == 1
