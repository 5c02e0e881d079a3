"""bytesplat's registered methods, read from its own ``nerfstudio.method_configs`` entry points.

nerfstudio's method table (``nerfstudio.configs.method_configs``) imports every built-in model and
builds its list of external methods, each of which calls ``inspect.stack()``: seconds of start-up
before any plugin is asked. Our launchers (``bytesplat-train``, ``python -m bytesplat_ns.train``)
only need bytesplat's methods, so they load the entry points of this distribution (pyproject.toml,
the same ones ``ns-train`` lists) and nothing else, and parse their command line as ``ns-train``
does (:func:`parse_method_config`).
"""

from __future__ import annotations

import importlib.metadata
from typing import Dict, List, Optional, Tuple

from bytesplat_ns.errors import BytesplatError

ENTRY_POINT_GROUP = "nerfstudio.method_configs"
PACKAGE = "bytesplat_ns"


def registered_methods() -> Tuple[Dict, Dict[str, str]]:
    """``(configs, descriptions)`` by method name, for every bytesplat method spec registered with
    nerfstudio, in name order."""
    configs, descriptions = {}, {}
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    for point in sorted(points, key=lambda p: p.name):
        if point.value.split(".", 1)[0] != PACKAGE:
            continue  # another plugin's method
        spec = point.load()
        configs[point.name] = spec.config
        descriptions[point.name] = spec.description
    if not configs:
        raise BytesplatError("No bytesplat method is registered with nerfstudio (is bytesplat-ns installed?).")
    return configs, descriptions


def parse_method_config(configs: Dict, descriptions: Dict[str, str], argv: Optional[List[str]], description: str):
    """The config of the method named on the command line, parsed as ``ns-train`` parses its
    methods (one subcommand per method, fixed fields hidden, booleans taking a value)."""
    import tyro

    union = tyro.conf.SuppressFixed[  # type: ignore[valid-type]
        tyro.conf.FlagConversionOff[tyro.extras.subcommand_type_from_defaults(defaults=configs, descriptions=descriptions)]
    ]
    return tyro.cli(union, args=argv, description=description)
