"""``fp4-dynamo-shim`` in process: every command's words, exit code and stream, and what it hands on.

tests/verify/test_command_line.py runs the command line as users install it (a console script in a venv, ``python -m``),
which costs a child interpreter per case. Here ``cli.main`` is called directly, so each of its branches is held
cheaply: the help pages against the reviewed text (tests/data/cli_help.txt), ``status``, the hand-over to
verify, and install-hook/uninstall-hook's messages with the real writer (and its check, a new interpreter) in
temporary directories. Where a write must fail, the standard library's ``tempfile.mkstemp``/``Path.unlink`` refuse
it (this runner is root, which permission bits do not stop); where a directory must be one of this interpreter's
site directories, ``site.getsitepackages`` says so (the ``sites`` fixture).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

import cli_help
import fp4_dynamo_shim
from _fp4_dynamo_shim import cli
from _fp4_dynamo_shim.errors import EXIT_USAGE
from _fp4_dynamo_shim.activation import site_files
from _fp4_dynamo_shim import startup_files


def test_the_help_pages_are_the_reviewed_text():
    if cli_help.recorded_python_version() != cli_help.python_version():
        pytest.skip(f"tests/data/cli_help.txt holds argparse's layout under Python {cli_help.recorded_python_version()}")
    assert cli_help.pages() == cli_help.FILE.read_text(), "python tools/golden/cli_help.py, then review the diff"


def test_version_prints_the_packages_own_version(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"fp4-dynamo-shim {fp4_dynamo_shim.__version__}\n"


@pytest.mark.parametrize("argv, words", [
    ([], "the following arguments are required: command"),
    (["install-hook", "--unknown"], "unrecognized arguments: --unknown"),
    (["status", "extra"], "unrecognized arguments: extra"),
])
def test_a_usage_error_exits_3_on_stderr_with_the_usage_line(argv, words, capsys):
    """3, not argparse's 2, which means "not applied" here; a command's own parser too."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    error = capsys.readouterr().err
    assert exited.value.code == EXIT_USAGE and error.startswith("usage: fp4-dynamo-shim") and words in error, error


@pytest.mark.parametrize("from_sys_argv", [False, True])
def test_status_prints_this_process_status_as_indented_json(from_sys_argv, monkeypatch, capsys):
    if from_sys_argv:
        monkeypatch.setattr(sys, "argv", ["fp4-dynamo-shim", "status"])
    assert cli.main(None if from_sys_argv else ["status"]) == 0
    assert capsys.readouterr().out == json.dumps(fp4_dynamo_shim.status(), indent=2) + "\n"


def test_verify_hands_every_argument_after_it_to_verifys_own_command_line(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", "--json", "--device", "tpu"])  # verify's own parser refuses the device
    assert exited.value.code == EXIT_USAGE and "argument --device: invalid choice: 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", "--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"fp4-dynamo-shim {fp4_dynamo_shim.__version__}\n"


@pytest.mark.parametrize("command", ["install-hook", "uninstall-hook"])
def test_a_site_dir_that_is_not_a_directory_is_a_usage_error_naming_it(command, tmp_path, capsys):
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--site-dir", str(missing)])
    assert exited.value.code == EXIT_USAGE
    assert f"fp4-dynamo-shim: error: {command}: {missing} is not a directory" in capsys.readouterr().err


def refuse(monkeypatch, error):
    """Every write of the hook's files fails with ``error``, as the system would refuse it."""
    def refused(*arguments, **keywords):
        raise error

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    monkeypatch.setattr(Path, "unlink", refused)


@pytest.fixture
def without_the_kill_switch(monkeypatch):
    monkeypatch.delenv("FP4_DYNAMO_SHIM_DISABLE", raising=False)


@pytest.mark.parametrize("flag, route", [([], "sitecustomize"), (["--sitecustomize"], "sitecustomize")])
def test_install_hook_writes_where_it_is_told_and_says_what_it_wrote_then_what_it_found(
        flag, route, without_the_kill_switch, tmp_path, capsys):
    """A directory on no site path gets the sitecustomize route, asked for or not: a .pth there would never run."""
    assert cli.main(["install-hook", "--site-dir", str(tmp_path), *flag]) == 0
    file = tmp_path / "sitecustomize.py"
    checked = f"({route} route; checked: a new interpreter runs it)\n"
    assert capsys.readouterr() == (f"wrote the import hook to {file} {checked}", "")
    assert cli.main(["install-hook", "--site-dir", str(tmp_path), *flag]) == 0
    assert capsys.readouterr() == (f"import hook already present in {file} {checked}", "")


def test_install_hook_under_the_kill_switch_says_the_hook_does_nothing_while_it_is_set(tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.setenv("FP4_DYNAMO_SHIM_DISABLE", "yes")
    assert cli.main(["install-hook", "--site-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == (
        "fp4-dynamo-shim install-hook: FP4_DYNAMO_SHIM_DISABLE=yes is set in this environment: the hook is installed "
        "(checked without the variable), but it applies nothing in any process that inherits the variable. Unset "
        "it to have the shim applied.\n")


@pytest.mark.parametrize("value", ["0", ""])
def test_there_is_no_kill_switch_note_where_the_switch_is_off(value, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FP4_DYNAMO_SHIM_DISABLE", value)
    assert cli.main(["install-hook", "--site-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


def test_install_hook_that_a_new_interpreter_does_not_run_fails_with_the_writers_words_and_takes_it_back(
        sites, without_the_kill_switch, capsys):
    """A site directory of this process only (stood in): the .pth written there is not read by a new interpreter."""
    assert cli.main(["install-hook", "--site-dir", str(sites[0])]) == 1
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("fp4-dynamo-shim install-hook: ")
    assert str(sites[0] / startup_files.HOOK_PTH) in said.err and list(sites[0].iterdir()) == []


@pytest.mark.parametrize("command, error, words", [
    ("install-hook", PermissionError(13, "Permission denied"), "cannot write the hook in {} (Permission denied); "
                                                               "nothing was changed"),
    ("install-hook", OSError("the disk went away"), "cannot write the hook in {} (the disk went away); "
                                                    "nothing was changed"),
    ("uninstall-hook", PermissionError(13, "Permission denied"), "cannot change {} (Permission denied)"),
    ("uninstall-hook", OSError("the disk went away"), "cannot change {} (the disk went away)"),
])
@pytest.mark.parametrize("given", [True, False])
def test_a_hook_command_that_cannot_write_names_the_directory_and_the_reason(command, error, words, given, sites,
                                                                           without_the_kill_switch, tmp_path,
                                                                           monkeypatch, capsys):
    """The directory named is the one given, or this interpreter's first site directory where none is."""
    where = tmp_path / "given" if given else sites[0]
    where.mkdir(exist_ok=True)
    if command == "uninstall-hook":
        (where / startup_files.HOOK_PTH).write_text(site_files.HOOK_PTH_TEXT)
    refuse(monkeypatch, error)
    assert cli.main([command, *(["--site-dir", str(where)] if given else [])]) == 1
    said = capsys.readouterr()
    assert said.err == f"fp4-dynamo-shim {command}: {words.format(where)}\n" and said.out == ""


@pytest.mark.parametrize("removed", [1, 2])
def test_uninstall_hook_names_every_file_it_changed(removed, tmp_path, capsys):
    files = [tmp_path / startup_files.HOOK_PTH, tmp_path / "sitecustomize.py"][:removed]
    files[0].write_text(site_files.HOOK_PTH_TEXT)
    if removed == 2:
        files[1].write_text(site_files.BLOCK)
    assert cli.main(["uninstall-hook", "--site-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "removed the import hook from " + ", ".join(map(str, files)) + "\n"
    assert not any(file.exists() for file in files)


@pytest.mark.parametrize("given", [True, False])
def test_uninstall_hook_with_nothing_to_remove_names_where_it_looked(given, sites, tmp_path, capsys):
    where = tmp_path if given else sites[0]
    assert cli.main(["uninstall-hook", *(["--site-dir", str(tmp_path)] if given else [])]) == 0
    assert capsys.readouterr().out == f"no import hook in {where}\n"


def test_install_and_uninstall_hook_for_real_in_a_directory_on_no_site_path(tmp_path, capsys):
    """The real writer and its check (a new interpreter that finds the block), end to end through main."""
    block = tmp_path / "sitecustomize.py"
    assert cli.main(["install-hook", "--site-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"wrote the import hook to {block} (sitecustomize route; checked: a new " \
                                      "interpreter runs it)\n"
    assert cli.main(["uninstall-hook", "--site-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"removed the import hook from {block}\n" and not block.exists()


def test_uninstall_hook_on_a_block_whose_end_marker_is_gone_fails_naming_the_file(tmp_path, capsys):
    path = tmp_path / "sitecustomize.py"
    path.write_text(site_files.BLOCK.replace(startup_files.END, "# edited by hand"))
    assert cli.main(["uninstall-hook", "--site-dir", str(tmp_path)]) == 1
    said = capsys.readouterr()
    assert said.err == (f"fp4-dynamo-shim uninstall-hook: {path}: found {startup_files.BEGIN!r} without "
                        f"{startup_files.END!r}; fix the file by hand\n") and said.out == ""
