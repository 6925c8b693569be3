"""What a job's session() decides before Spark starts (no Spark): the workers' interpreter."""

import sys

import pytest

from pipeline import jobs


@pytest.mark.parametrize("master", ["local", "local[*]", "local[4]", "local[2,2]", " local[*] "])
def test_worker_python__local_master_gets_this_interpreter(master):
    assert jobs.worker_python({}, master) == sys.executable


@pytest.mark.parametrize(
    "master",
    [
        "spark://spark-master:7077",
        "yarn",
        "k8s://https://kube:6443",
        "local-cluster[2,1,1024]",
        "local[0]",
        "localhost",
    ],
)
def test_worker_python__cluster_master_keeps_sparks_choice(master):
    """The executors may not have this path: Spark's `python3`, or spark.pyspark.python."""
    assert jobs.worker_python({}, master) is None


@pytest.mark.parametrize("master", ["local[*]", "spark://spark-master:7077"])
def test_worker_python__already_set_is_kept(master):
    assert jobs.worker_python({"PYSPARK_PYTHON": "/opt/python/bin/python3"}, master) is None
