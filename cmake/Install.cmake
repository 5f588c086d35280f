# Install rules: `cmake --install build --prefix P` (every component), the .deb (CPack, the same
# files under /usr) and the wheel (scikit-build-core installs the "python" component only).
include(CMakePackageConfigHelpers)
set(perseus_package_dir "${PERSEUS_INSTALL_PYTHONDIR}/perseus")

# The `perseus` package with its own copy of libperseus (perseus/lib/libperseus.so, which
# _native.py loads first), its version file and the examples (perseus/examples/).
install(DIRECTORY "${PROJECT_SOURCE_DIR}/lib/framework_shims/perseus/"
        DESTINATION "${perseus_package_dir}" COMPONENT python
        PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
configure_file("${CMAKE_CURRENT_LIST_DIR}/_version.py.in"
               "${PERSEUS_GENERATED_DIR}/python/_version.py" @ONLY)
install(FILES "${PERSEUS_GENERATED_DIR}/python/_version.py"
        DESTINATION "${perseus_package_dir}" COMPONENT python)
install(FILES "$<TARGET_FILE:perseus>" DESTINATION "${perseus_package_dir}/lib"
        RENAME libperseus.so COMPONENT python)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/examples/" DESTINATION "${perseus_package_dir}/examples"
        COMPONENT python PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
install(TARGETS perseusrun RUNTIME DESTINATION "${PERSEUS_INSTALL_BINDIR}" COMPONENT python)

# For C and C++ programs: the shared library with its soname links, the header, a CMake package
# (find_package(Perseus) -> Perseus::perseus) and a pkg-config file (perseus.pc).
install(TARGETS perseus EXPORT PerseusTargets
        LIBRARY DESTINATION "${PERSEUS_INSTALL_LIBDIR}" COMPONENT runtime
                NAMELINK_COMPONENT development)
install(FILES "${PROJECT_SOURCE_DIR}/include/perseus/perseus.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/perseus" COMPONENT development)
install(EXPORT PerseusTargets NAMESPACE Perseus:: DESTINATION "${PERSEUS_INSTALL_CMAKEDIR}"
        COMPONENT development)
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/PerseusConfig.cmake.in"
  "${CMAKE_BINARY_DIR}/generated/PerseusConfig.cmake"
  INSTALL_DESTINATION "${PERSEUS_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${CMAKE_BINARY_DIR}/generated/PerseusConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${CMAKE_BINARY_DIR}/generated/PerseusConfig.cmake"
              "${CMAKE_BINARY_DIR}/generated/PerseusConfigVersion.cmake"
        DESTINATION "${PERSEUS_INSTALL_CMAKEDIR}" COMPONENT development)
file(RELATIVE_PATH perseus_pc_to_prefix "/prefix/${PERSEUS_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" perseus_pc_to_prefix_trimmed "${perseus_pc_to_prefix}")
configure_file("${CMAKE_CURRENT_LIST_DIR}/perseus.pc.in" "${CMAKE_BINARY_DIR}/generated/perseus.pc"
               @ONLY)
install(FILES "${CMAKE_BINARY_DIR}/generated/perseus.pc"
        DESTINATION "${PERSEUS_INSTALL_LIBDIR}/pkgconfig" COMPONENT development)

include(Packaging)
