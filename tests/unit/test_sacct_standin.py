"""The sacct stand-in's pure parts: scontrol/jobcomp records, sacct's JobID forms, options and output formats.
Its answers against the real cluster and submitit's parser: tests/integration/test_local_cluster.py."""
import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "scripts" / "sacct-standin"
_loader = importlib.machinery.SourceFileLoader("sacct_standin", str(PATH))
sacct = importlib.util.module_from_spec(importlib.util.spec_from_loader(_loader.name, _loader))
_loader.exec_module(sacct)

#: Lines as printed by ``scontrol show job -o`` and jobcomp/filetxt on the local cluster (shortened).
PENDING_ARRAY = ("JobId=7 ArrayJobId=7 ArrayTaskId=1-3%1 ArrayTaskThrottle=1 JobName=wrap UserId=root(0) "
                 "JobState=PENDING Reason=JobArrayTaskLimit ExitCode=0:0 NodeList= Partition=debug")
ARRAY_TASK = "JobId=10 ArrayJobId=7 ArrayTaskId=0 JobName=wrap JobState=COMPLETED ExitCode=0:0 NodeList=n1"
JOBCOMP = ("JobId=8 UserId=root(0) GroupId=root(0) Name=my job JobState=FAILED Partition=debug "
           "NodeList=n[1-2] NodeCnt=2 WorkDir=/tmp/a b ExitCode=3:0 ")


def test_records_keep_values_that_contain_spaces():
    rec = sacct.parse_record(JOBCOMP)
    assert rec["Name"] == "my job" and rec["WorkDir"] == "/tmp/a b" and rec["ExitCode"] == "3:0"
    assert sacct.parse_record(PENDING_ARRAY)["NodeList"] == ""


def test_job_ids_take_sacct_forms_for_plain_jobs_array_tasks_and_pending_ranges():
    assert sacct.job_id_text(sacct.parse_record(JOBCOMP)) == "8"
    assert sacct.job_id_text(sacct.parse_record(ARRAY_TASK)) == "7_0"
    assert sacct.job_id_text(sacct.parse_record(PENDING_ARRAY)) == "7_[1-3%1]"


def test_a_job_query_matches_its_id_its_array_and_its_task():
    task = sacct.parse_record(ARRAY_TASK)
    assert sacct.matches(task, {"7"}) and sacct.matches(task, {"10"}) and sacct.matches(task, {"7_0"})
    assert not sacct.matches(task, {"8"}) and sacct.matches(task, set())


def test_later_sources_win_and_rows_come_in_job_id_order():
    old = {"JobId": "10", "JobState": "RUNNING"}
    new = {"JobId": "10", "JobState": "COMPLETED"}
    merged = sacct.merge([old, {"JobId": "9"}], [new])
    assert [r["JobId"] for r in merged] == ["9", "10"] and merged[1]["JobState"] == "COMPLETED"


def test_a_completing_job_keeps_the_node_list_of_its_allocation():
    ended = {"JobId": "12", "JobState": "COMPLETED", "NodeList": "n[1-2]"}  # the jobcomp line
    completing = {"JobId": "12", "JobState": "COMPLETING", "NodeList": "n1"}  # scontrol: n2's epilog is done
    (merged,) = sacct.merge([ended], [completing])
    assert merged["NodeList"] == "n[1-2]" and merged["JobState"] == "COMPLETING"
    (alone,) = sacct.merge([], [completing])  # nothing better known
    assert alone["NodeList"] == "n1"
    requeued = {"JobId": "12", "JobState": "RUNNING", "NodeList": "n3"}
    assert sacct.merge([ended], [requeued])[0]["NodeList"] == "n3"


def test_render_parsable2_parsable_and_columns():
    recs = [sacct.parse_record(JOBCOMP), sacct.parse_record(PENDING_ARRAY)]
    fields = ["jobid", "state", "nodelist"]
    assert sacct.render(recs, fields, "", True) == (
        "JobID|State|NodeList\n8|FAILED|n[1-2]\n7_[1-3%1]|PENDING|None assigned\n")
    assert sacct.render(recs[:1], fields, "|", False) == "8|FAILED|n[1-2]|\n"
    assert sacct.render(recs[:1], ["jobname", "user"], None, True).split() == ["JobName", "User", "my", "job", "root"]


def test_options_submitit_uses_parse_and_others_are_rejected(capsys):
    args = sacct.parse_args(["-o", "JobID,State,NodeList", "--parsable2", "-j", "7", "-j", "8,9"])
    assert args.fields == ["jobid", "state", "nodelist"] and args.parsable == "" and args.wanted == {"7", "8", "9"}
    with pytest.raises(SystemExit):
        sacct.parse_args(["-S", "now"])
    assert "unrecognized arguments: -S now" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sacct.parse_args(["-o", "JobID,MaxRSS"])
    assert "field maxrss is not supported; supported: JobID, JobIDRaw" in capsys.readouterr().err


def test_conf_reader_takes_key_value_lines_without_comments(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("# c\nJobCompType=jobcomp/filetxt # inline\nJobCompLoc=/x/jobcomp.txt\nNodeName=n1 CPUs=2\n")
    got = sacct.read_conf(str(conf))
    assert got["JobCompType"] == "jobcomp/filetxt" and got["JobCompLoc"] == "/x/jobcomp.txt"
    assert "NodeName" in got  # the whole node line is kept as one value, never split into keys
