"""``bytesplat-bench loop``: both training loops run the stubbed steps, and the report shows them."""

from __future__ import annotations

import json

from bytesplat_ns.bench import loop_overhead
from bytesplat_ns.bench.report import loop_table


def test_both_loops_timed_and_reported(tmp_path):
    out = tmp_path / "loop.json"
    result = loop_overhead.main(["--iterations", "25", "--repeats", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["benchmark"] == "bytesplat-bench loop" and result["cpu_count"] >= 1
    assert [row["loop"] for row in result["rows"]] == ["lean", "nerfstudio"]
    for row in result["rows"]:
        assert row["iterations"] == 25 and len(row["us_per_step"]) == 2 and all(us > 0 for us in row["us_per_step"])
    table = loop_table([{"result": result}])
    assert any(line.startswith("| lean | 25 |") for line in table) and any("| nerfstudio |" in line for line in table)


def test_the_stub_runs_no_model_work(tmp_path):
    trainer = loop_overhead.stubbed_trainer(tmp_path)
    first = trainer.train_iteration(1)
    assert trainer.train_iteration(2) is first and trainer.callbacks == [] and trainer._start_step == 1
