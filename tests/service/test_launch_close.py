"""Closing a cluster spillway started: a worker slow to exit after its work is killed,
and the close goes on with a warning; other failures still raise."""

from __future__ import annotations

import logging

import pytest

from service.launch import close_cluster


class Cluster:
    def __init__(self, error: BaseException | None = None):
        self.error, self.closed = error, 0

    def close(self):
        self.closed += 1
        if self.error is not None:
            raise self.error


def test_a_worker_outliving_the_close_timeout_is_a_warning(caplog):
    cluster = Cluster(TimeoutError())
    with caplog.at_level(logging.WARNING, logger="spillway"):
        close_cluster(cluster)
    assert cluster.closed == 1
    assert "did not exit within distributed's close timeout and was killed" in caplog.text


def test_a_clean_close_logs_nothing(caplog):
    cluster = Cluster()
    with caplog.at_level(logging.WARNING, logger="spillway"):
        close_cluster(cluster)
    assert cluster.closed == 1 and caplog.text == ""


def test_other_close_failures_still_raise():
    with pytest.raises(OSError, match="scheduler gone"):
        close_cluster(Cluster(OSError("scheduler gone")))
