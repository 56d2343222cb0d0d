"""Step results: one versioned schema per file, read back as written, and bad files named."""

import json

import pytest

import autotailor as at
from autotailor.pipeline.results import Chosen, Exported, ExportsRecord, RunRecord, SearchRecord, StepDone

SEARCH = SearchRecord(device="ort-cpu:threads=1", target="host/ort-cpu", latency_model=None, axis="latency_ms",
                      settings={"population": 10}, seconds=1.5, predictions=100, verify_rounds=0, beam_size=4,
                      finalists=0, choices=[Chosen("latency_ms=1", {"latency_ms": 1.0}, {"a": 1}, 0.9,
                                                   {"latency_ms": 0.9}, 0.1),
                                            Chosen("latency_ms=0.5", {"latency_ms": 0.5}, None, None, {}, 0.1)])


@pytest.mark.parametrize("record", [SEARCH, ExportsRecord([Exported("x", {"a": 1}, ["f.onnx"], {}, {"accuracy": 0.5})]),
                                    RunRecord("t.toml", {"compile": StepDone(1.0, {"argv": ["compile"]})})])
def test_records_read_back_as_written(record, tmp_path):
    record.write(tmp_path)
    assert json.loads((tmp_path / record.FILE).read_text())["schema"] == record.SCHEMA
    assert type(record).read(tmp_path) == record


def test_picking_a_budget(tmp_path):
    assert [c.budget for c in SEARCH.pick("all")] == ["latency_ms=1"] == [c.budget for c in SEARCH.pick("1ms")]
    with pytest.raises(at.SearchError, match=r"--pick '1' names no chosen SubNet; the search chose: latency_ms=1"):
        SEARCH.pick("1")


@pytest.mark.parametrize("text,message", [
    (None, r"search.json does not exist: run `autotailor search .* --latency-ms ...`"),
    ("{not json", r"search.json is not valid JSON .* to rewrite it"),
    ('{"choices": []}', r"search.json is not of schema autotailor-search/1 \(found None\)"),
    ('{"schema": "autotailor-search/1", "choices": []}', r"search.json does not hold what autotailor-search/1 needs"),
])
def test_a_missing_corrupt_or_old_file_is_named_with_the_step_that_rewrites_it(text, message, tmp_path):
    if text is not None:
        (tmp_path / "search.json").write_text(text)
    with pytest.raises(at.AutoTailorError, match=message):
        SearchRecord.read(tmp_path)
