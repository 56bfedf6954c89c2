"""The guard that keeps every test out of the interpreter's own site directories (tests/support/own_site.py):
it must see a start-up file written, changed or removed there, and put each back as it was."""

from __future__ import annotations

import pytest

import own_site


def test_the_guard_sees_every_start_up_file_written_changed_or_removed_and_puts_them_back(tmp_path, monkeypatch):
    monkeypatch.setattr(own_site, "DIRECTORIES", (str(tmp_path / "site"), str(tmp_path / "user")))
    (tmp_path / "site").mkdir()
    (tmp_path / "user").mkdir()
    customize, kept = tmp_path / "site" / "sitecustomize.py", tmp_path / "user" / "usercustomize.py"
    customize.write_text("import os\n")
    kept.write_text("pass\n")
    (tmp_path / "site" / "unrelated.pth").write_text("import os\n")
    before = own_site.snapshot()
    assert sorted(before) == [customize, kept]

    hook = tmp_path / "user" / "fp4_dynamo_shim_hook.pth"
    hook.write_text("import fp4_dynamo_shim_hook\n")
    customize.write_text("import os\nimport fp4_dynamo_shim_hook; fp4_dynamo_shim_hook.install()\n")
    kept.unlink()
    (tmp_path / "site" / "unrelated.pth").write_text("changed\n")

    assert own_site.restore(before) == sorted(str(p) for p in (customize, hook, kept))
    assert not hook.exists() and customize.read_text() == "import os\n" and kept.read_text() == "pass\n"
    assert own_site.restore(before) == []


def test_the_guard_watches_this_interpreters_own_site_directories():
    import site

    assert set(site.getsitepackages()) <= set(own_site.DIRECTORIES)
    assert site.getusersitepackages() in own_site.DIRECTORIES


def test_a_block_that_writes_a_start_up_file_fails_naming_it_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(own_site, "DIRECTORIES", (str(tmp_path),))
    hook = tmp_path / "fp4_dynamo_shim_hook.pth"
    with pytest.raises(AssertionError, match="fp4_dynamo_shim_hook.pth"):
        with own_site.untouched():
            hook.write_text("import fp4_dynamo_shim_hook\n")
    assert not hook.exists()
    with own_site.untouched():
        (tmp_path / "elsewhere.pth").write_text("import os\n")
