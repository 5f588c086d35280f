# Where `cmake --install`, the .deb and the wheel put things, relative to the prefix. perseusrun
# finds the library and the `perseus` package by these same relative paths from its own
# executable (perseus/config.h), so an installed tree can be moved as a whole.
include(GNUInstallDirs)
if(SKBUILD)
  # A wheel (pip install .): the package at the root of site-packages, perseusrun in the
  # environment's bin/ (the wheel's scripts), nothing for C programs.
  set(PERSEUS_INSTALL_BINDIR "${SKBUILD_SCRIPTS_DIR}")
  set(PERSEUS_INSTALL_PYTHONDIR ".")
else()
  set(PERSEUS_INSTALL_BINDIR "${CMAKE_INSTALL_BINDIR}")
  # Debian's python3 reads /usr/lib/python3/dist-packages; other prefixes are found by
  # perseusrun (it puts this directory on the ranks' PYTHONPATH) or by PYTHONPATH.
  set(PERSEUS_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
      "Where cmake --install puts the perseus Python package, relative to the prefix")
endif()
set(PERSEUS_INSTALL_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
set(PERSEUS_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/Perseus")
