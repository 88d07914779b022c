"""A re-issued query starts with no TITO file of its own: the interrupted attempt's is moved to tito/interrupted/
(gyre_hpc.live.rollouts.set_aside), or the proxy's append would give the re-issued runs' call ids twice (seen in
benchmarks/chaos_live.py: a query whose runs had flushed before a preemption was re-issued, its group lost)."""
from gyre_hpc.live.rollouts import set_aside


def test_the_interrupted_attempts_file_is_moved_aside_under_a_new_name_each_time(tmp_path):
    tito = tmp_path / "tito" / "q00012.jsonl"
    tito.parent.mkdir()
    tito.write_text('{"first": 1}\n')
    first = set_aside(tito)
    assert not tito.exists() and first == tmp_path / "tito" / "interrupted" / "q00012.jsonl.0"
    tito.write_text('{"second": 1}\n')
    second = set_aside(tito)
    assert second.name == "q00012.jsonl.1"
    assert (first.read_text(), second.read_text()) == ('{"first": 1}\n', '{"second": 1}\n')


def test_a_query_that_flushed_nothing_has_nothing_to_set_aside(tmp_path):
    assert set_aside(tmp_path / "q00008.jsonl") is None
    assert not (tmp_path / "interrupted").exists()
