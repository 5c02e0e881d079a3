"""``bytesplat-bench city``: the views it times, the scene estimate, its report table, and one real run
on the tiny preset (CPU)."""

from __future__ import annotations

import json

import pytest

from bytesplat_ns.bench import city_render
from bytesplat_ns.bench.report import city_table
from bytesplat_ns.errors import BytesplatError


def test_view_kinds_follow_the_pose_order():
    kinds = city_render.view_indices(5, 3)
    assert kinds == {"aerial_orbit": [0, 2, 4], "aerial_close": [1, 3], "street": [5, 6, 7]}


@pytest.mark.parametrize("indices, count, expected", [
    ([0, 2, 4, 6, 8], 2, [0, 8]), ([0, 2, 4, 6, 8], 3, [0, 4, 8]), ([5, 6], 4, [5, 6]), ([1, 3, 5], 1, [3]),
    ([], 2, []), ([1, 2], 0, [])])
def test_spread_picks_evenly_from_first_to_last(indices, count, expected):
    assert city_render.spread(indices, count) == expected


def test_the_estimate_weights_each_kind_by_its_views():
    per_view = {"aerial_orbit": [4.0, 6.0], "aerial_close": [2.0], "street": []}
    counts = {"aerial_orbit": 10, "aerial_close": 10, "street": 5}
    # street has no timed view: the mean of all timed views (4.0) stands in for it
    assert city_render.estimate_scene_seconds(per_view, counts) == pytest.approx(10 * 5.0 + 10 * 2.0 + 5 * 4.0)
    with pytest.raises(BytesplatError):
        city_render.estimate_scene_seconds({k: [] for k in counts}, counts)


def test_a_run_on_the_tiny_city_times_every_kind_and_generates_it(tmp_path):
    out = tmp_path / "city.json"
    result = city_render.main(["--presets", "tiny", "--views-per-kind", "1", "--generate", "tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    (row,) = result["rows"]
    assert row["preset"] == "tiny" and row["views"] == sum(row["views_by_kind"].values())
    assert [v["kind"] for v in row["views_timed"]] == list(city_render.KINDS)
    assert all(v["seconds"] > 0 for v in row["views_timed"]) and row["estimated_scene_core_s"] > 0
    assert row["generated_s"] > 0 and result["command"].startswith("bytesplat-bench city --presets tiny")
    table = city_table([{"result": result}])
    assert any(line.startswith("| tiny | 64x36 |") for line in table)


def test_views_per_kind_must_be_positive(tmp_path):
    with pytest.raises(BytesplatError):
        city_render.main(["--presets", "tiny", "--views-per-kind", "0", "--out", str(tmp_path / "c.json")])
