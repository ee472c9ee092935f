"""The one thing pyproject.toml cannot say about the wheel.

setuptools' package discovery (`[tool.setuptools.packages.find]`) names a package after its
directory, so it never finds `sepo.conf`, which `package-dir` maps onto the top-level conf/
(pypa/setuptools#5145). This adds every mapped package to the discovered ones, so that no
package is listed by hand; everything else about the build is in pyproject.toml.
"""

from setuptools import setup
from setuptools.dist import Distribution


class MappedPackagesDistribution(Distribution):
    def parse_config_files(self, *args, **kwargs):
        super().parse_config_files(*args, **kwargs)
        found = list(self.packages or [])
        self.packages = found + [name for name in self.package_dir or {} if name and name not in found]


setup(distclass=MappedPackagesDistribution)
