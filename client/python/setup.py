"""setuptools hook for the staged `cairn` package (metadata: pyproject.toml).

The package carries a prebuilt extension (cairn/_cairn.*.so) and
libcairn.so.0, so its wheel is platform-specific, not pure Python: this
marks the distribution as having extension modules.
"""

from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    """A distribution whose wheel is tagged for this platform and Python."""

    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution)
