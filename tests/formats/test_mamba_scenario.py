"""Hybrid mamba models in a scenario: `engine_args.mamba_cache_mode` and `prefix_match_unit`
checked field by field, and the feature `mamba` derived from the model folder's config."""

import json
import shutil

import pytest

from conformance.formats.features import needed
from conformance.formats.scenario import ScenarioError, load_scenario
from tests.helpers import REPO

SCENARIO = REPO / "scenarios" / "mamba_align_prefix_hits.json"


def _write(tmp_path, args: dict):
    shutil.copytree(REPO / "scenarios" / "models", tmp_path / "models")
    data = json.loads(SCENARIO.read_text(encoding="utf-8"))
    data["engine_args"].update(args)
    (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
    return tmp_path / "s.json"


@pytest.mark.parametrize("args, field, words", [
    ({"mamba_cache_mode": "prefix"}, "engine_args.mamba_cache_mode", "must be one of ['none', 'align', 'all']"),
    ({"mamba_cache_mode": 1}, "engine_args.mamba_cache_mode", "must be str"),
    ({"prefix_match_unit": 0}, "engine_args.prefix_match_unit", "between 1 and"),
    ({"prefix_match_unit": "32"}, "engine_args.prefix_match_unit", "must be int"),
])
def test_the_mamba_fields_are_checked(tmp_path, args, field, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_write(tmp_path, args))
    assert err.value.field == field and words in err.value.problem, err.value.problem


@pytest.mark.parametrize("mode", ["none", "align", "all"])
def test_every_mode_of_the_pinned_release_loads_and_changes_the_hash(tmp_path, mode):
    base = load_scenario(SCENARIO)
    scenario = load_scenario(_write(tmp_path, {"mamba_cache_mode": mode}))
    assert scenario.engine_args["mamba_cache_mode"] == mode
    assert (scenario.sha256 == base.sha256) == (mode == "align")


def test_the_feature_comes_from_the_model_config(tmp_path):
    """Nemotron-H's pattern mixes mamba (M) and attention (*) layers; a pattern of one kind, a
    model folder without one, or one whose config cannot be read needs no `mamba`."""
    scenario = load_scenario(SCENARIO)
    assert "mamba" in scenario.features
    config = json.loads((REPO / "scenarios" / "models" / "nemotron-nano-9b-v2" / "config.json").read_text())
    for pattern, expected in (("M-M*-", True), ("M-M-", False), ("*-*-", False), (None, False)):
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(dict(config, hybrid_override_pattern=pattern)))
        assert ("mamba" in needed({"model": str(folder)})) is expected, pattern
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert "mamba" not in needed({"model": str(tmp_path / "broken")})
    assert "mamba" not in needed({"model": str(tmp_path / "absent")})
