"""nerfstudio's per-step timing scalars go to tensorboard on logged steps only (unless
--timing-scalars-every-step), a logged step's scalars as one event (unless
--batched-tensorboard-scalars False), every other event as before; at exit the writers are closed and
the heap frozen before the interpreter's teardown (bytesplat_ns/event_writers.py, bytesplat_ns/heap.py)."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bytesplat_ns import event_writers
from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config

ITERATIONS, STEPS_PER_LOG = 12, 5


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return ensure_scene(SceneSpec(size="small", num_views=6, width=32), cache_dir=tmp_path_factory.mktemp("scenes"))


def scalar_steps(trainer):
    events = EventAccumulator(str(trainer.base_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def train(scene, out_dir, every_step: bool):
    """``every_step``: nerfstudio's writing (every scalar at every step, one event each); else ours."""
    config = copy.deepcopy(bytesplat_config)
    config.timing_scalars_every_step = every_step
    config.batched_tensorboard_scalars = not every_step
    config.learning_rates_every_step = every_step
    config.logging.steps_per_log = STEPS_PER_LOG
    trainer, _ = setup_trainer("timings", config, scene, ITERATIONS, out_dir, seed=0, device="cpu")
    trainer.train()
    event_writers.close_tensorboard_writers()  # every event on disk before it is read back
    return trainer


def test_timings_on_logged_steps_and_everything_else_as_nerfstudio(scene, tmp_path):
    thinned = scalar_steps(train(scene, tmp_path / "thinned", every_step=False))
    full = scalar_steps(train(scene, tmp_path / "full", every_step=True))
    logged = list(range(0, ITERATIONS, STEPS_PER_LOG))  # 0, 5, 10
    assert full["Train Iter (time)"] == list(range(ITERATIONS)) and full["ETA (time)"] == list(range(ITERATIONS))
    assert thinned["Train Iter (time)"] == logged and thinned["ETA (time)"] == logged
    # nerfstudio skips the first two steps' rays/sec
    assert full["Train Rays / Sec"] == list(range(2, ITERATIONS))
    assert thinned["Train Rays / Sec"] == [s for s in logged if s >= 2]
    assert full["learning_rate/means"] == list(range(ITERATIONS)) and thinned["learning_rate/means"] == logged
    assert set(thinned) == set(full)
    others = {tag for tag in full if tag not in event_writers.PER_STEP_TIMINGS
              and not tag.startswith(event_writers.LEARNING_RATE_PREFIX)}
    assert "Train Loss" in others and "Train Total (time)" in others
    assert {tag: thinned[tag] for tag in others} == {tag: full[tag] for tag in others}


def test_a_second_trainer_in_one_process_writes_only_its_own_run(scene, tmp_path):
    """nerfstudio's global writer list only grows; each trainer's setup retires the earlier one's, so
    the first run's event file holds its own events once, not the second run's as well."""
    from nerfstudio.utils import writer

    first = train(scene, tmp_path / "first", every_step=False)
    train(scene, tmp_path / "second", every_step=False)
    logged = list(range(0, ITERATIONS, STEPS_PER_LOG))
    assert scalar_steps(first)["Train Loss"] == logged
    assert sum(isinstance(w, writer.TensorboardWriter) for w in writer.EVENT_WRITERS) == 1


def test_the_switch_is_in_config_yml(scene, tmp_path):
    config = copy.deepcopy(bytesplat_config)
    config.timing_scalars_every_step = True
    config.freeze_heap_at_exit = False
    trainer, _ = setup_trainer("switches", config, scene, 1, tmp_path, seed=0, device="cpu")
    trainer.config.save_config()
    saved = yaml.load((trainer.base_dir / "config.yml").read_text(), Loader=yaml.Loader)
    assert saved.timing_scalars_every_step is True and saved.freeze_heap_at_exit is False
    assert saved.batched_tensorboard_scalars is True
    assert bytesplat_config.timing_scalars_every_step is False and bytesplat_config.freeze_heap_at_exit is True
    assert bytesplat_config.batched_tensorboard_scalars is True and bytesplat_config.learning_rates_every_step is False


def written_scalars(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("steps_per_write, queued_after_each_step", [
    (1, [0, 0, 1, 2, 3, 4, 5, 6]),  # each closed step a logged step later
    (3, [0, 0, 0, 0, 3, 3, 3, 6]),  # in bursts of three, once three are held before the newest
])
def test_batched_scalars_read_back_as_nerfstudios(tmp_path, steps_per_write, queued_after_each_step):
    """The same add_scalar sequence through nerfstudio's writer and through a batched one: the same
    tags, steps and values in tensorboard, one event per logged step, handed to tensorboard
    ``steps_per_write`` at a time, the rest written on flush."""
    import torch
    from nerfstudio.utils import writer
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    steps = list(range(0, 80, 10))
    calls = []
    for step in steps:
        calls += [("Train Loss", torch.rand(()) * 3, step), ("Train Loss Dict/main_loss", torch.rand(1), step),
                  ("Train Metrics Dict/gaussian_count", 1234 + step, step), ("GPU Memory (MB)", 512.25, step),
                  ("Train Iter (time)", 0.005 + step, step)]
    nerfstudio_writer = writer.TensorboardWriter(log_dir=tmp_path / "theirs")
    ours_summary = SummaryWriter(log_dir=str(tmp_path / "ours"))
    ours = event_writers.TrainingLoopTensorboardWriter(ours_summary, steps_per_log=10, steps_per_write=steps_per_write)
    events_queued = []
    real_add_event = ours_summary._get_file_writer().add_event
    ours_summary._get_file_writer().add_event = (
        lambda event, step=None, walltime=None: events_queued.append(step) or real_add_event(event, step, walltime))
    queued = []
    for i, (name, value, step) in enumerate(calls):
        nerfstudio_writer.write_scalar(name, value, step)
        ours.write_scalar(name, value, step)
        if i + 1 == len(calls) or calls[i + 1][2] != step:
            queued.append(len(events_queued))
    assert queued == queued_after_each_step
    ours.flush_scalars()
    assert events_queued == steps
    nerfstudio_writer.tb_writer.close()
    ours_summary.close()
    theirs = written_scalars(tmp_path / "theirs")
    assert written_scalars(tmp_path / "ours") == theirs and len(theirs) == 5 and theirs["GPU Memory (MB)"][0] == (0, 512.25)


def test_dicts_are_batched_without_reading_their_values(tmp_path, monkeypatch):
    """A logged step's loss and metrics dicts: nerfstudio's write_scalar_dict reads each value with
    float() (on a GPU, a wait for the step's queued work); the batched writer reads none while the
    step is written and puts the same tags, steps and values in tensorboard."""
    import torch
    from nerfstudio.utils import writer
    from torch.utils.tensorboard import SummaryWriter

    dicts = [("Train Loss Dict", {"main_loss": torch.tensor(0.25), "scale_reg": torch.tensor([0.5])}),
             ("Train Metrics Dict", {"psnr": torch.tensor(21.5, dtype=torch.float64), "gaussian_count": torch.tensor(1234),
                                     "visible": torch.tensor(True), "host_value": 7})]
    nerfstudio_writer = writer.TensorboardWriter(log_dir=tmp_path / "theirs")
    ours_summary = SummaryWriter(log_dir=str(tmp_path / "ours"))
    ours = event_writers.TrainingLoopTensorboardWriter(ours_summary, steps_per_log=10)
    reads = []
    real_float = torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: reads.append(t) or real_float(t))
    for name, values in dicts:
        ours.write_scalar_dict(name, values, 0)
    assert reads == []  # collected as they are (read once the step is complete: HostValues)
    for name, values in dicts:
        ours.write_scalar_dict(name, values, 10)
    ours.flush_scalars()
    reads.clear()
    for step in (0, 10):
        for name, values in dicts:
            nerfstudio_writer.write_scalar_dict(name, values, step)
    assert len(reads) == 10  # nerfstudio's: one per tensor value
    nerfstudio_writer.tb_writer.close()
    ours_summary.close()
    theirs = written_scalars(tmp_path / "theirs")
    assert written_scalars(tmp_path / "ours") == theirs and len(theirs) == 6


def test_a_logged_steps_tensors_stacked_in_order():
    import torch

    values = [torch.tensor(1.5), torch.tensor(3), torch.tensor([2.25]), torch.tensor(True),
              torch.tensor(7.0, dtype=torch.float64), torch.tensor(-4)]
    stacked, order = event_writers.stack_as_float64(values)
    assert stacked.dtype == torch.float64 and sorted(order) == list(range(len(values)))
    in_order = [value for _, value in sorted(zip(order, stacked.tolist()))]
    assert in_order == [1.5, 3.0, 2.25, 1.0, 7.0, -4.0]
    one, order = event_writers.stack_as_float64(values[:1])
    assert one.tolist() == [1.5] and order == [0]


def test_host_values_of_numbers_and_tensors():
    import torch

    host = event_writers.HostValues([1, 2.5, torch.tensor(3.25), torch.tensor([4.5]), True])
    assert host.values() == [1.0, 2.5, 3.25, 4.5, 1.0]


@pytest.mark.gpu
def test_host_values_of_gpu_tensors_without_a_wait_at_creation():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    big = torch.rand(4096, 4096, device="cuda")
    scalars = [(big @ big).mean(), torch.tensor(7.0, device="cuda"), 3, torch.tensor(2.0),
               torch.tensor(12345, device="cuda"), torch.tensor(True, device="cuda")]
    expected = [float(v) for v in scalars]
    host = event_writers.HostValues(scalars)
    assert host.copy.is_pinned()
    assert host.values() == pytest.approx(expected, rel=1e-12)


EXIT_SCRIPT = """
import atexit, gc, sys
from pathlib import Path
import nerfstudio.configs.base_config
from nerfstudio.utils import writer
from bytesplat_ns import heap

def report():  # registered before the hook: atexit runs it after the hook
    print("frozen", gc.get_freeze_count() > 0, "collecting", gc.isenabled(), flush=True)

atexit.register(report)
writer.EVENT_WRITERS.append(writer.TensorboardWriter(log_dir=Path(sys.argv[1])))
writer.EVENT_WRITERS[-1].write_scalar("last", 3.5, 7)  # queued in tensorboard's writer thread, not yet on disk
heap.freeze_heap_at_exit()
heap.freeze_heap_at_exit()  # armed once
"""


def test_exit_hook_writes_every_event_and_freezes_the_heap(tmp_path):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT_SCRIPT), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "frozen True collecting False"
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("last")] == [(7, 3.5)]


def test_a_failing_process_keeps_its_exit_code(tmp_path):
    script = textwrap.dedent(EXIT_SCRIPT) + "\nraise SystemExit(3)\n"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3


def test_start_up_pause_then_freeze(monkeypatch):
    import gc

    from bytesplat_ns import heap

    monkeypatch.setitem(heap._state, "paused", False)
    assert gc.isenabled()
    try:
        heap.pause_collections()
        assert not gc.isenabled()
        before = gc.get_freeze_count()
        heap.freeze_start_up()
        assert gc.isenabled() and gc.get_freeze_count() >= before
        heap.freeze_start_up()  # no pause: nothing to do
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("freeze", [True, False])
def test_training_starts_with_the_start_ups_objects_frozen(scene, tmp_path, monkeypatch, freeze):
    from bytesplat_ns import heap

    frozen = []
    monkeypatch.setattr(heap, "freeze_set_up", lambda: frozen.append(True))
    config = copy.deepcopy(bytesplat_config)
    config.freeze_heap_after_setup = freeze
    trainer, _ = setup_trainer("freeze", config, scene, 2, tmp_path, seed=0, device="cpu")
    assert frozen == []  # not during set-up: after it
    trainer.train()
    event_writers.close_tensorboard_writers()
    assert frozen == ([True] if freeze else [])
    assert bytesplat_config.freeze_heap_after_setup is True


def test_freezing_after_set_up_ends_a_pause_or_freezes_alone(monkeypatch):
    import gc

    from bytesplat_ns import heap

    monkeypatch.setitem(heap._state, "paused", False)
    try:
        monkeypatch.setitem(heap._state, "set_up_frozen", False)
        heap.pause_collections()
        heap.freeze_set_up()  # a launcher's pause: ended, collections back on
        assert gc.isenabled() and not heap._state["paused"] and gc.get_freeze_count() > 0
        gc.unfreeze()
        monkeypatch.setitem(heap._state, "set_up_frozen", False)
        objects = [[] for _ in range(1000)]  # noqa: F841  (alive now: frozen by the next call)
        heap.freeze_set_up()
        assert gc.isenabled() and gc.get_freeze_count() >= 1000
        gc.unfreeze()
        heap.freeze_set_up()  # once per process: a second trainer's call freezes nothing
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.enable()


# the count before the imports: an interpreter may start with objects frozen (the GPU machine's did: 375)
DISCOVERY_SCRIPT = """
import gc, sys
import torch  # a heap worth freezing
before = gc.get_freeze_count()
{imports}
print(gc.get_freeze_count() - before, "bytesplat_ns.data.dataparser" in sys.modules, "bytesplat_ns.method_configs" in sys.modules)
"""


def _frozen_after(imports: str):
    done = subprocess.run([sys.executable, "-c", DISCOVERY_SCRIPT.format(imports=imports)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, dataparser, methods = done.stdout.split()
    return int(count), dataparser == "True", methods == "True"


def test_nerfstudios_plugin_discovery_freezes_the_heap_and_a_plain_import_does_not():
    # ns-train, ns-eval, ...: the method table discovers our dataparser and methods, and each first import freezes
    count, dataparser, methods = _frozen_after("import nerfstudio.configs.method_configs")
    assert dataparser and methods and count > 100_000  # torch and nerfstudio's modules, functions, classes
    # importing the same modules without a method table being built freezes nothing
    count, dataparser, methods = _frozen_after("import bytesplat_ns.data.dataparser\n"
                                               "import bytesplat_ns.method_configs.bytesplat")
    assert dataparser and methods and count == 0
