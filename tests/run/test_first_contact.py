"""First contact without tracebacks: bad JSON, missing extras, bad values refused before a
cluster starts, the catalogue's allowed values, progress bars kept out of redirected logs,
and a script without the main guard told what to do."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from spillway.cli import main


def test_bad_params_json_is_one_line():
    result = CliRunner().invoke(main, ["run", "transpose-sum", "--params-json", "{bad"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "is not JSON" in result.output


def test_bad_param_refused_before_a_cluster_starts(monkeypatch):
    import spillway.launch

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for a bad value")

    monkeypatch.setattr(spillway.launch, "open_cluster", no_cluster)
    result = CliRunner().invoke(main, ["run", "reduction", "--param", "axis=5"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "spillway: error: axis: 5 is not one of all, 0, 1"


def test_catalogue_lists_allowed_values():
    result = CliRunner().invoke(main, ["workflows"])
    assert "--param axis=...  Reduce over all elements or along one axis (not for histogram) " \
           "(one of all, 0, 1; default all)" in result.output


def test_service_commands_without_the_extra_are_one_line():
    for command in (["serve"], ["tenant", "list"]):
        code = ("import sys; [sys.modules.__setitem__(m, None) for m in ('fastapi', 'uvicorn', 'sqlalchemy')];"
                f"from spillway.cli import main; main({command!r})")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert "which is not installed: pip install 'spillway[service]'" in out.stderr


def test_progress_bar_stays_out_of_a_redirected_log(monkeypatch):
    from spillway.run.bars import progress_bar

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_bar("run", True) is None
    stream = io.StringIO()
    bar = progress_bar("run", stream)  # a stream asked for explicitly still gets its bar
    bar.close()


def test_script_without_main_guard_is_told_so(tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent("""
        import spillway
        with spillway.local(cpu=True, n_workers=1, dashboard_address=None) as cluster:
            print(cluster.run("transpose-sum", progress=False)["result"])
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0
    assert 'start the cluster under `if __name__ == "__main__":`' in out.stderr
    assert "bootstrapping phase" not in out.stderr
