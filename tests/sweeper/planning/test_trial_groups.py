import pytest

from lightning_hydro.sweeper.planning.search_space import Configuration
from lightning_hydro.sweeper.planning.trial_groups import Trial, partition_label, partition_of, plan_groups


def trials(batch_sizes):
    return [
        Trial(i, Configuration({"bs": bs, "lr": 0.1}, {"bs": str(bs), "lr": "0.1"})) for i, bs in enumerate(batch_sizes)
    ]


def test_partitions_then_balanced_groups_under_the_limit():
    groups = plan_groups(trials([32] * 20 + [64] * 3), non_fusible=["bs"], fusion_limit=lambda p: 16, refill=False)
    assert [len(g.trial_ids) for g in groups] == [10, 10, 3]
    assert [g.slots for g in groups] == [10, 10, 3]
    assert [partition_label(g.partition) for g in groups] == ["bs=32", "bs=32", "bs=64"]
    assert sorted(i for g in groups for i in g.trial_ids) == list(range(23))
    assert [g.group_id for g in groups] == ["group_0000", "group_0001", "group_0002"]


def test_refill_puts_a_partition_in_one_group_with_capped_slots():
    groups = plan_groups(trials([32] * 20), non_fusible=["bs"], fusion_limit=lambda p: 16, refill=True, first_index=5)
    assert [(g.group_id, len(g.trial_ids), g.slots) for g in groups] == [("group_0005", 20, 16)]


def test_keys_not_swept_do_not_partition():
    assert partition_of(trials([32])[0].configuration, ["model.hidden_dim", "bs"]) == (("bs", "32"),)
    assert partition_label(()) == "all"
    groups = plan_groups(trials([32, 64]), non_fusible=[], fusion_limit=lambda p: 4, refill=False)
    assert [g.trial_ids for g in groups] == [(0, 1)]


def test_a_limit_below_one_is_rejected():
    with pytest.raises(ValueError, match="the fusion limit of partition 'bs=32' must be >= 1, got 0"):
        plan_groups(trials([32]), non_fusible=["bs"], fusion_limit=lambda p: 0, refill=False)
