"""Only here to put fp4_dynamo_shim.pth at the root of site-packages; everything else is in pyproject.toml."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "fp4_dynamo_shim.pth"


class BuildPyWithPth(build_py):
    """site.py runs .pth files only from a site directory's top level, so the hook file must land there.

    A wheel gets it at its root through ``build_lib``. An editable install (``pip install -e .``) does not
    ship ``build_lib``: setuptools' ``editable_wheel`` points ``install.install_lib`` at the unpacked
    editable wheel, whose files (all of them) go into the wheel, so the file is written there instead.
    """

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.mkpath(target)
        self.copy_file(os.path.join("src", PTH), os.path.join(target, PTH))

    def get_outputs(self, *args, **kwargs):
        outputs = super().get_outputs(*args, **kwargs)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


setup(cmdclass={"build_py": BuildPyWithPth})
