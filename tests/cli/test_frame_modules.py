"""The import machinery's frames resolve to their modules through inspect's map (no sys.modules walk)."""

import importlib
import inspect
import sys

import pytest

import bytesplat_ns  # noqa: F401  (the plugin maps the frozen names when imported)
from bytesplat_ns.frame_modules import IMPORT_MACHINERY, STRING_CODE, map_frozen_import_frames


@pytest.fixture
def import_frames(tmp_path, monkeypatch):
    """The frames above a module body while it is being imported: some run the import machinery."""
    (tmp_path / "frames_while_imported.py").write_text(
        "import sys\nFRAMES = []\nframe = sys._getframe(1)\nwhile frame is not None:\n"
        "    FRAMES.append(frame)\n    frame = frame.f_back\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("frames_while_imported")
    yield [f for f in module.FRAMES if f.f_code.co_filename.startswith("<frozen importlib")]
    sys.modules.pop("frames_while_imported", None)


def test_import_machinery_frames_resolve_to_their_modules(import_frames, monkeypatch):
    assert import_frames, "an import runs through the frozen import machinery"
    for frame in import_frames:
        module = inspect.getmodule(frame)
        assert module is not None and module.__name__ in IMPORT_MACHINERY
        assert frame.f_code.co_filename == f"<frozen {module.__name__}>"


def test_without_the_map_the_lookup_finds_nothing(import_frames, monkeypatch):
    """No module's __file__ names a frozen module: only the map resolves these frames."""
    monkeypatch.setattr(inspect, "modulesbyfile", {})
    assert all(inspect.getmodule(frame) is None for frame in import_frames)
    map_frozen_import_frames()
    assert all(inspect.getmodule(frame) is not None for frame in import_frames)


def test_stack_inside_an_import_sees_the_same_functions(import_frames):
    """nerfstudio reads inspect.stack()[2].function; the mapped frames keep their names."""
    for frame in import_frames:
        assert inspect.getframeinfo(frame, context=1).function == frame.f_code.co_name


def test_string_compiled_frames_belong_to_no_module_without_a_walk(monkeypatch):
    """A dataclass's generated __init__ (file name "<string>") has no module: the map answers so at
    once, the same answer as the walk over sys.modules, which it no longer runs."""
    from dataclasses import dataclass

    @dataclass
    class Listing:
        frame: object = None

        def __post_init__(self):
            self.frame = sys._getframe(1)  # the generated __init__

    frame = Listing().frame
    assert frame.f_code.co_filename == STRING_CODE
    monkeypatch.setattr(inspect, "modulesbyfile", {})
    monkeypatch.setattr(inspect, "_filesbymodname", {})
    assert inspect.getmodule(frame) is None and inspect.modulesbyfile  # the walk ran and found nothing
    walked = {}

    class Modules(dict):
        def copy(self):
            walked["yes"] = True
            return dict.copy(self)

    map_frozen_import_frames()
    monkeypatch.setattr(sys, "modules", Modules(sys.modules))
    assert inspect.getmodule(frame) is None and "yes" not in walked
    assert inspect.getframeinfo(frame, context=1).function == "__init__"
