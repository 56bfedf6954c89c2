"""install-hook and uninstall-hook called in this process (``activation.site_files``): the exact text each route
writes, what a second install and an uninstall leave of a user's file, how a file is replaced, what a failed
check takes back out and the words that name what is in the way.

Every file goes to a temporary directory. Where this process must count temporary directories as its site
directories, the ``site_packages`` fixture stands in ``site.getsitepackages`` for this process only: a new
interpreter still reads only its real site directories, so a ``.pth`` written into a stood-in one is never run
by it. Child interpreters (``check=True``) are started only where the check is what a test is about.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

import pytest

from _fp4_dynamo_shim.activation import site_files
from _fp4_dynamo_shim import startup_files

BEGIN, END, BLOCK = startup_files.BEGIN, startup_files.END, site_files.BLOCK


@pytest.fixture
def site_packages(tmp_path, monkeypatch):
    """Two temporary directories this process takes for its site directories, and no user site directory."""
    directories = [tmp_path / "site-a", tmp_path / "site-b"]
    for directory in directories:
        directory.mkdir()
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(d) for d in directories])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    return directories


@pytest.fixture
def no_site_packages(monkeypatch):
    """This process reads no site directory (an interpreter started with ``-S`` and ``-s``, say)."""
    monkeypatch.setattr(site, "getsitepackages", lambda: [])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)


def on_pythonpath(monkeypatch, directory: Path) -> None:
    """Put ``directory`` first on PYTHONPATH for every interpreter started from here on (the variable's other
    entries, such as a source tree under test, stay behind it)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def users_sitecustomize(tmp_path, monkeypatch) -> Path:
    """A sitecustomize.py of the user's that comes first on sys.path in every new interpreter, as Debian's
    ``/usr/lib/python3.X/sitecustomize.py`` does for a venv's interpreter."""
    directory = tmp_path / "users-path"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text("import os\n")
    on_pythonpath(monkeypatch, directory)
    return directory / "sitecustomize.py"


# --- what each route writes ------------------------------------------------------------------------------------

def test_the_pth_route_writes_one_import_line_and_a_second_install_changes_nothing(site_packages):
    directory = site_packages[1]
    path = directory / startup_files.HOOK_PTH
    assert site_files.install_hook(directory, check=False) == site_files.Installed(path, True, "pth")
    text = path.read_text()
    assert text == site_files.HOOK_PTH_TEXT and sorted(os.listdir(directory)) == [startup_files.HOOK_PTH]
    assert text.startswith("import ") and text.count("\n") == 1  # site.py runs a .pth line only if it starts so
    assert site_files.install_hook(directory, check=False) == site_files.Installed(path, False, "pth")
    assert path.read_text() == text
    path.write_text("import fp4_dynamo_shim_hook; fp4_dynamo_shim_hook.install()\n")  # another, older line
    assert site_files.install_hook(directory, check=False) == site_files.Installed(path, True, "pth")
    assert path.read_text() == text


def test_asking_for_sitecustomize_in_a_site_directory_writes_the_block_and_no_pth(site_packages):
    path = site_packages[0] / "sitecustomize.py"
    assert site_files.install_hook(site_packages[0], sitecustomize=True, check=False) == site_files.Installed(
        path, True, "sitecustomize")
    assert path.read_text() == BLOCK and sorted(os.listdir(site_packages[0])) == ["sitecustomize.py"]


@pytest.mark.parametrize("existing, written", [
    (None, BLOCK),
    ("", BLOCK),
    ("import os\n", "import os\n\n" + BLOCK),
    ("import os", "import os\n\n" + BLOCK),  # no newline at the end of the user's last line
], ids=["no file", "empty file", "user lines", "user lines without a final newline"])
def test_the_sitecustomize_block_follows_the_users_lines_after_one_blank_line(existing, written, tmp_path):
    path = tmp_path / "sitecustomize.py"
    if existing is not None:
        path.write_text(existing)
    assert site_files.install_hook(tmp_path, check=False) == site_files.Installed(path, True, "sitecustomize")
    assert path.read_text() == written
    assert site_files.install_hook(tmp_path, check=False) == site_files.Installed(path, False, "sitecustomize")
    assert path.read_text() == written and sorted(os.listdir(tmp_path)) == ["sitecustomize.py"]


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_installing_into_something_that_is_not_a_directory_names_it_and_writes_nothing(kind, tmp_path):
    target = tmp_path / "site-packages"
    if kind == "a file":
        target.write_text("")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{target} is not a directory")):
        site_files.install_hook(target, check=False)
    assert sorted(os.listdir(tmp_path)) == ([] if kind == "missing" else ["site-packages"])


# --- the default directory -------------------------------------------------------------------------------------

def test_without_a_directory_both_commands_use_the_first_site_directory(site_packages):
    path = site_packages[0] / startup_files.HOOK_PTH
    assert startup_files.default_site_dir() == site_packages[0]
    assert site_files.install_hook(check=False) == site_files.Installed(path, True, "pth")
    assert os.listdir(site_packages[1]) == []
    assert site_files.uninstall_hook() == [path] and os.listdir(site_packages[0]) == []
    assert site_files.uninstall_hook() == [] and os.listdir(site_packages[0]) == []


@pytest.mark.parametrize("how", ["no site directories", "a site.py without getsitepackages"])
def test_without_site_directories_the_default_is_this_interpreters_purelib(how, no_site_packages, monkeypatch):
    """Old virtualenv releases shipped a site.py without ``getsitepackages``."""
    if how != "no site directories":
        monkeypatch.delattr(site, "getsitepackages")
    assert startup_files.site_dirs() == []
    assert startup_files.default_site_dir() == Path(sysconfig.get_paths()["purelib"])


def test_site_directories_are_listed_once_each_existing_ones_only_user_site_last(tmp_path, monkeypatch):
    real, user = tmp_path / "site", tmp_path / "user"
    real.mkdir()
    user.mkdir()
    (tmp_path / "alias").symlink_to(real)
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(real), str(tmp_path / "gone"), str(tmp_path / "alias")])
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(user))
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    assert startup_files.site_dirs() == [real, user]
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    assert startup_files.site_dirs() == [real]


# --- uninstall -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("before, after", [
    ("import os\nos.environ.setdefault('SOMETHING', 'kept')\n", ""),
    ("import os\n\n", "import sys\nsys.dont_write_bytecode = True\n"),
    (f"# the block below ends at {END!r}\nimport os\n", ""),
    ("import os\n", f"# a block starts at {BEGIN!r}\n"),
    ("import os\n", f"# a block ends at {END!r}\n"),
    ("", "DEBUG = True  \n"),
    ("import sys\nPREFIX = sys.prefix\n", "del PREFIX\n"),
], ids=["lines before", "lines after", "a line before quoting the end marker", "a line after quoting the begin marker",
        "a line after quoting the end marker", "trailing spaces on the last line", "a last line ending in X"])
def test_uninstall_keeps_the_users_own_sitecustomize_lines_byte_for_byte(before, after, tmp_path):
    path = tmp_path / "sitecustomize.py"
    path.write_text(before + BLOCK + after)
    (tmp_path / startup_files.HOOK_PTH).write_text(site_files.HOOK_PTH_TEXT)
    assert site_files.uninstall_hook(tmp_path) == [tmp_path / startup_files.HOOK_PTH, path]
    assert path.read_bytes() == (before + after).encode()
    assert sorted(os.listdir(tmp_path)) == ["sitecustomize.py"]


def test_uninstall_refuses_a_block_whose_end_marker_is_gone_naming_the_file_and_changes_nothing(tmp_path):
    """The .pth beside it stays too: an uninstall that stops half-way would leave the hook in one file."""
    path = tmp_path / "sitecustomize.py"
    broken = "import os\n" + BLOCK.replace(END, "# edited by hand")
    path.write_text(broken)
    (tmp_path / startup_files.HOOK_PTH).write_text(site_files.HOOK_PTH_TEXT)
    with pytest.raises(ValueError) as raised:
        site_files.uninstall_hook(tmp_path)
    assert str(raised.value) == f"{path}: found {BEGIN!r} without {END!r}; fix the file by hand"
    assert path.read_text() == broken and sorted(os.listdir(tmp_path)) == [startup_files.HOOK_PTH, "sitecustomize.py"]


# --- how a file is replaced ------------------------------------------------------------------------------------

def test_install_and_uninstall_keep_the_permission_bits_of_the_users_sitecustomize(tmp_path):
    path = tmp_path / "sitecustomize.py"
    path.write_text("import os\n")
    path.chmod(0o644)
    site_files.install_hook(tmp_path, check=False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    path.chmod(0o640)
    site_files.uninstall_hook(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text() == "import os\n"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
@pytest.mark.parametrize("route", ["pth", "sitecustomize"])
def test_a_new_hook_file_gets_the_permission_bits_open_would_give_it(route, umask, mode, site_packages):
    """Under root's usual umask 022 a hook in a shared site-packages must be readable by every user: a .pth
    that others cannot read is silently skipped by their interpreters, an unreadable sitecustomize.py fails
    their every start."""
    previous = os.umask(umask)
    try:
        installed = site_files.install_hook(site_packages[0], sitecustomize=route == "sitecustomize", check=False)
    finally:
        os.umask(previous)
    assert installed.route == route and stat.S_IMODE(installed.path.stat().st_mode) == mode


def test_while_a_file_is_replaced_only_a_hidden_temporary_beside_it_is_in_the_directory(tmp_path, monkeypatch):
    """The one moment a starting interpreter could see the temporary is the swap: ``os.replace`` is wrapped
    (it still does the swap) to list the directory then. What is left after a kill at that moment is the
    temporary: hidden, named after the file it was for, and neither a ``.pth`` nor a ``.py``."""
    seen, replace = [], os.replace

    def replace_and_look(source, target):
        seen.append(sorted(os.listdir(os.path.dirname(target))))
        replace(source, target)

    monkeypatch.setattr(os, "replace", replace_and_look)
    (tmp_path / "sitecustomize.py").write_text("import os\n")
    site_files.install_hook(tmp_path, check=False)
    ((temporary, original),) = seen
    assert re.fullmatch(r"\.sitecustomize\.py\.[a-z0-9_]+\.tmp", temporary), temporary
    assert original == "sitecustomize.py" and sorted(os.listdir(tmp_path)) == ["sitecustomize.py"]


def test_a_temporary_directory_on_another_filesystem_does_not_stop_the_write(tmp_path, monkeypatch):
    """TMPDIR on a tmpfs and site-packages on a disk is common; a rename cannot cross filesystems. /dev/shm
    stands for that tmpfs (``tempfile.tempdir`` is what TMPDIR sets when tempfile first reads it)."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    elsewhere = tempfile.mkdtemp(dir="/dev/shm")
    try:
        monkeypatch.setattr(tempfile, "tempdir", elsewhere)
        assert site_files.install_hook(tmp_path, check=False).changed
        assert (tmp_path / "sitecustomize.py").read_text() == BLOCK and os.listdir(elsewhere) == []
    finally:
        shutil.rmtree(elsewhere)


def test_a_write_that_fails_raises_the_systems_error_and_leaves_no_temporary(tmp_path):
    """A directory where the file should be: the rename onto it fails (no stand-in needed)."""
    in_the_way = tmp_path / "sitecustomize.py"
    in_the_way.mkdir()
    with pytest.raises(IsADirectoryError):
        site_files._write_atomically(in_the_way, BLOCK)
    assert os.listdir(tmp_path) == ["sitecustomize.py"] and in_the_way.is_dir()


# --- the check: a new interpreter must run what was written ---------------------------------------------------

def test_a_pth_no_new_interpreter_reads_is_refused_taken_back_out_and_the_site_directories_named(
        site_packages, users_sitecustomize, monkeypatch):
    """The .pth goes to a directory this process counts as a site directory (stand-in: ``site_packages``) and
    a new interpreter does not. FP4_DYNAMO_SHIM=1 is set here, so the package's own .pth starts the hook in
    that interpreter: it must not pass for the route just written. The check is on by default."""
    monkeypatch.setenv("FP4_DYNAMO_SHIM", "1")
    path = site_packages[0] / startup_files.HOOK_PTH
    with pytest.raises(site_files.HookNotRunning) as raised:
        site_files.install_hook(site_packages[0])
    assert str(raised.value) == (
        f"wrote the hook to {path}, but a new interpreter does not run it (site directories processed: "
        f"{site_packages[0]}, {site_packages[1]}; sitecustomize: {users_sitecustomize}); took it back out.")
    assert os.listdir(site_packages[0]) == []


@pytest.mark.parametrize("existing", [None, "import os\nos.environ.setdefault('SOMETHING', 'kept')\n"],
                         ids=["no file", "user lines"])
def test_a_sitecustomize_another_one_shadows_is_refused_naming_that_one_and_the_users_file_is_restored(
        existing, site_packages, users_sitecustomize):
    """The block goes into a site directory (stand-in: ``site_packages``) whose sitecustomize a new interpreter
    never imports, because the user's comes first on its sys.path; the check must not put the directory on
    PYTHONPATH itself (that would pass a route the user's interpreters never take)."""
    path = site_packages[0] / "sitecustomize.py"
    if existing is not None:
        path.write_text(existing)
    with pytest.raises(site_files.HookNotRunning) as raised:
        site_files.install_hook(site_packages[0], sitecustomize=True)
    message = str(raised.value)
    assert message.startswith(f"wrote the hook to {path}, but this interpreter imports {users_sitecustomize} "
                              "as sitecustomize (it comes first on sys.path), so the hook would never run; "
                              "took it back out.") and "Install the .pth route instead" in message
    left = {p.name: p.read_bytes() for p in site_packages[0].iterdir()}
    assert left == ({} if existing is None else {"sitecustomize.py": existing.encode()})


def test_the_check_runs_with_the_users_pythonpath_where_an_old_hook_module_is_found_first(
        tmp_path, monkeypatch, no_site_packages):
    """An old copy of ``fp4_dynamo_shim_hook`` (its install() does nothing) sits on the user's PYTHONPATH,
    ahead of the installed package: the block then does nothing, and the check must see that rather than a
    PYTHONPATH of its own. No site directories here, so the message says so."""
    old = tmp_path / "old-install"
    old.mkdir()
    (old / "fp4_dynamo_shim_hook.py").write_text("def install(*arguments):\n    pass\n")
    on_pythonpath(monkeypatch, old)
    target = tmp_path / "target"
    target.mkdir()
    path = target / "sitecustomize.py"
    with pytest.raises(site_files.HookNotRunning) as raised:
        site_files.install_hook(target)
    assert str(raised.value) == (f"wrote the hook to {path}, but a new interpreter does not run it (site "
                                 f"directories processed: none; sitecustomize: {path}); took it back out.")
    assert os.listdir(target) == []


def test_the_check_runs_without_the_kill_switch_set_here(tmp_path, monkeypatch):
    """install-hook under FP4_DYNAMO_SHIM_DISABLE=1 installs and checks (the CLI then says the switch is set)."""
    monkeypatch.setenv("FP4_DYNAMO_SHIM_DISABLE", "1")
    path = tmp_path / "sitecustomize.py"
    assert site_files.install_hook(tmp_path) == site_files.Installed(path, True, "sitecustomize")
    assert path.read_text() == BLOCK


# --- which routes this interpreter has --------------------------------------------------------------------------

def test_installed_routes_names_each_file_and_a_sitecustomize_that_hides_a_block(site_packages, tmp_path, monkeypatch):
    """Stand-in for the sitecustomize this interpreter imported at start-up: a module in ``sys.modules``."""
    first, second = site_packages
    (second / startup_files.PACKAGE_PTH).write_text("import os\n")
    (first / startup_files.HOOK_PTH).write_text(site_files.HOOK_PTH_TEXT)
    (second / "sitecustomize.py").write_text(BLOCK)
    other = tmp_path / "other" / "sitecustomize.py"
    other.parent.mkdir()
    other.write_text("import os\n")

    def imported(path):
        monkeypatch.setitem(sys.modules, "sitecustomize", types.SimpleNamespace(__file__=str(path)))
        return startup_files.installed_routes()

    files = {"pth": str(second / startup_files.PACKAGE_PTH), "hook_pth": str(first / startup_files.HOOK_PTH)}
    assert imported(second / "sitecustomize.py") == {
        **files, "sitecustomize": str(second / "sitecustomize.py"), "sitecustomize_shadowed_by": None}
    assert imported(other) == {**files, "sitecustomize": None, "sitecustomize_shadowed_by": str(other)}
    other.write_text(f"import os\n{site_files.ONE_LINER}\n")  # the documented line, written by hand
    assert imported(other) == {**files, "sitecustomize": str(other), "sitecustomize_shadowed_by": None}
    monkeypatch.delitem(sys.modules, "sitecustomize")
    monkeypatch.syspath_prepend(str(second))  # not imported yet: the one import would load
    assert startup_files.installed_routes()["sitecustomize"] == str(second / "sitecustomize.py")
    for path in (first / startup_files.HOOK_PTH, second / startup_files.PACKAGE_PTH):
        path.unlink()
    (second / "sitecustomize.py").unlink()
    (second / "sitecustomize.py").mkdir()  # unreadable as a file: no route
    assert imported(other.parent / "missing.py") == {
        "pth": None, "hook_pth": None, "sitecustomize": None, "sitecustomize_shadowed_by": None}


def test_a_users_sitecustomize_that_prints_undecodable_bytes_does_not_stop_the_check(tmp_path):
    """Another start-up file's output is not the probe's: only the probe's own last line is read."""
    path = tmp_path / "sitecustomize.py"
    path.write_text("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe not UTF-8\\n'); sys.stdout.flush()\n")
    installed = site_files.install_hook(tmp_path)
    assert installed.changed and installed.route == "sitecustomize" and BEGIN in path.read_text()


@pytest.mark.parametrize("existing", [None, "import os\n"])
def test_a_check_that_cannot_finish_takes_the_hook_back_out_and_says_so(existing, tmp_path, monkeypatch):
    """Stand-in: the new interpreter that never answers is a ``subprocess.run`` that raises TimeoutExpired at
    once (a real one waits 120 s). What is real: the writer and the undo."""
    path = tmp_path / "sitecustomize.py"
    if existing is not None:
        path.write_text(existing)

    def never_answers(command, **keywords):
        raise subprocess.TimeoutExpired(command, keywords["timeout"])

    monkeypatch.setattr(subprocess, "run", never_answers)
    with pytest.raises(site_files.HookNotRunning) as raised:
        site_files.install_hook(tmp_path)
    assert str(raised.value).startswith(f"wrote the hook to {path}, but could not check that a new interpreter runs "
                                        "it (TimeoutExpired: Command ")
    assert str(raised.value).endswith("timed out after 120 seconds); took it back out.")
    assert (path.read_text() if existing is not None else path.exists()) == (existing or False)


def test_a_sitecustomize_module_without_a_file_or_spec_reads_as_none(monkeypatch):
    """A sitecustomize put in sys.modules by hand (no ``__file__``, ``__spec__`` None) makes find_spec raise
    ValueError: the origin is then unknown, not an error."""
    monkeypatch.setitem(sys.modules, "sitecustomize", types.ModuleType("sitecustomize"))
    assert startup_files.sitecustomize_origin() is None
