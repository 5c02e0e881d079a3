"""bytesplat-train: ns-train's config and run for the bytesplat methods, without nerfstudio's method table."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.helpers.cli import cli_env, describe

ARGS = ["bytesplat", "--max-num-iterations", "4", "--pipeline.model.sh-degree", "2", "--vis", "tensorboard",
        "--machine.device-type", "cpu", "bytesplat-scene", "--scene-size", "small"]


def test_it_parses_the_same_config_as_ns_train():
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion

    from bytesplat_ns.launcher import parse
    from bytesplat_ns.method_registry import registered_methods

    ours = parse(ARGS)
    theirs = tyro.cli(AnnotatedBaseConfigUnion, args=ARGS)
    assert yaml.dump(ours) == yaml.dump(theirs)
    assert ours.pipeline.model.sh_degree == 2 and ours.max_num_iterations == 4
    configs, descriptions = registered_methods()
    assert set(configs) == {"bytesplat", "bytesplat-distributed", "bytesplat-large", "bytesplat-distributed-large"}
    assert all(descriptions.values())


def test_another_plugins_methods_are_not_offered(monkeypatch):
    import importlib.metadata

    from bytesplat_ns import method_registry

    real = importlib.metadata.entry_points

    def with_a_stranger(group):
        points = list(real(group=group))
        stranger = importlib.metadata.EntryPoint("stranger", "some_plugin.configs:method", group)
        return [*points, stranger]

    monkeypatch.setattr(importlib.metadata, "entry_points", with_a_stranger)
    configs, _ = method_registry.registered_methods()
    assert "stranger" not in configs and "bytesplat" in configs


@pytest.mark.slow
def test_it_trains_without_importing_nerfstudios_method_table(tmp_path):
    """A real run in a fresh interpreter: the run folder, config.yml and checkpoint ns-train would write,
    and nerfstudio's method table never imported."""
    out = tmp_path / "outputs"
    code = (
        "import sys\n"
        "from bytesplat_ns.launcher import entrypoint\n"
        f"entrypoint({[*ARGS[:-3], '--output-dir', str(out), '--timestamp', 'run', *ARGS[-3:]]!r})\n"
        "print('METHOD TABLE IMPORTED:', 'nerfstudio.configs.method_configs' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=cli_env(tmp_path / "cache"), capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, describe(result)
    assert "METHOD TABLE IMPORTED: False" in result.stdout, describe(result)
    run = out / "bytesplat-scene" / "bytesplat" / "run"
    config = yaml.load((run / "config.yml").read_text(), Loader=yaml.Loader)
    assert config.method_name == "bytesplat" and config.pipeline.model.sh_degree == 2
    assert [p.name for p in (run / "nerfstudio_models").iterdir()] == ["step-000000003.ckpt"]
