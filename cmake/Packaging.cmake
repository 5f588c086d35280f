# `cpack -G DEB` in the build directory: one .deb with everything `cmake --install` puts in a
# prefix, under /usr. Its Depends come from dpkg-shlibdeps (the Debian packages of the libraries
# perseusrun and libperseus link: libssh2-1, libgloo0, ...) plus python3 for the package. CUDA
# and NCCL are not among them: libperseus opens them at run time where they are present.
set(CPACK_PACKAGE_NAME perseus)
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "Perseus developers <perseus@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Perseus: launcher (perseusrun) and communication runtime for distributed training")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3 (>= 3.9)")
set(CPACK_STRIP_FILES OFF)
include(CPack)
