"""Only here to put fp4_dynamo_shim.pth at the root of the wheel; everything else is in pyproject.toml."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPth(build_py):
    """site.py runs .pth files only from site-packages' top level, so the hook file must land there."""

    def run(self):
        super().run()
        self.copy_file(os.path.join("src", "fp4_dynamo_shim.pth"), os.path.join(self.build_lib, "fp4_dynamo_shim.pth"))


setup(cmdclass={"build_py": BuildPyWithPth})
