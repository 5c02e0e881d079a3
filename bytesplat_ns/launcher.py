r"""``bytesplat-train``: ``ns-train`` for the bytesplat methods, without nerfstudio's method table.

    bytesplat-train bytesplat --data path/to/scene nerfstudio-data      # = ns-train bytesplat ...

Same methods, arguments, defaults, output folder and ``config.yml`` as ``ns-train`` (the run loads in
``ns-eval``, ``ns-viewer`` and ``ns-export`` as any other), and the same single-process training
(``Trainer.setup`` then ``Trainer.train``, seeded with ``--machine.seed``). What it skips is
nerfstudio's method table (``nerfstudio.configs.method_configs``): ``ns-train`` imports every built-in
model and lists its external methods (each one calling ``inspect.stack()``) before it parses a
single argument, seconds of start-up that a bytesplat run does not need (docs/wallclock.md has the
measured difference). Only bytesplat's methods are offered (``bytesplat-train --help``).

Several devices or machines (``--machine.num-devices N``) go through nerfstudio's own launcher,
which imports the method table anyway.
"""

from __future__ import annotations

import random
from typing import List, Optional

from bytesplat_ns import heap
from bytesplat_ns.errors import BytesplatError


def parse(argv: Optional[List[str]] = None):
    """The trainer config from the command line, as ``ns-train`` builds it for these methods."""
    import tyro

    from bytesplat_ns.method_registry import parse_method_config, registered_methods

    tyro.extras.set_accent_color("bright_yellow")
    return parse_method_config(*registered_methods(), argv, __doc__)


def prepare(config):
    """What ``ns-train`` does between parsing and training: the ``--data`` alias, ``--load-config``,
    the run's timestamp, and the config printed and saved. Returns the config to train."""
    import yaml
    from nerfstudio.utils.rich_utils import CONSOLE

    if config.data:
        CONSOLE.log("Using --data alias for --data.pipeline.datamanager.data")
        config.pipeline.datamanager.data = config.data
    if config.prompt:
        raise BytesplatError("--prompt is for text-to-3D methods; bytesplat models take none.")
    if config.load_config:
        CONSOLE.log(f"Loading pre-set config from: {config.load_config}")
        config = yaml.load(config.load_config.read_text(), Loader=yaml.Loader)
    config.set_timestamp()
    config.print_to_terminal()
    config.save_config()
    return config


def train_single_process(config) -> None:
    """Seed, set up and train in this process (``ns-train``'s one-device path)."""
    import numpy as np
    import torch
    from nerfstudio.utils import profiler

    torch.backends.cudnn.benchmark = True  # as ns-train sets it (fixed image sizes: cuDNN may pick its kernels once)
    seed = config.machine.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    try:
        trainer = config.setup(local_rank=0, world_size=1)
        trainer.setup()
        heap.freeze_start_up()
        trainer.train()
    except KeyboardInterrupt:
        import traceback

        from nerfstudio.utils.rich_utils import CONSOLE

        CONSOLE.print(traceback.format_exc())
    finally:
        profiler.flush_profiler(config.logging)


def main(config) -> None:
    config = prepare(config)
    machine = config.machine
    if machine.num_devices * machine.num_machines == 1:
        train_single_process(config)
        return
    from nerfstudio.scripts.train import launch, train_loop  # several processes: nerfstudio's spawner

    heap.freeze_start_up()

    launch(main_func=train_loop, num_devices_per_machine=machine.num_devices, device_type=machine.device_type,
           num_machines=machine.num_machines, machine_rank=machine.machine_rank, dist_url=machine.dist_url,
           config=config)


def entrypoint(argv: Optional[List[str]] = None) -> None:
    heap.pause_collections()  # imports, parsing and setup create long-lived objects only: collect after them
    import bytesplat_ns  # noqa: F401  (checkpoint allow-list, the one-line error hook)
    from bytesplat_ns.deferred_compile import defer_nerfstudio_compile

    defer_nerfstudio_compile()  # before splatfacto is imported (deferred_compile.py)

    main(parse(argv))


if __name__ == "__main__":
    entrypoint()
