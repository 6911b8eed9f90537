"""The one compiled part of hvdtrain (the rest is in setup.cfg): ``hvdtrain._packing``,
the torch adapter's fused copy and square sum. Optional: without a C compiler the
package installs and the adapter uses torch's own operations instead."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hvdtrain._packing", ["hvdtrain/_native/packing.c"],
                             extra_compile_args=["-O3"], optional=True)])
