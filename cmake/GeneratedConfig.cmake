# Publishes the configure-time results as 0/1 macros and version strings in perseus/config.h.
set(PERSEUS_LIBSSH2_VERSION "${LIBSSH2_VERSION}")
set(PERSEUS_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")
configure_file("${CMAKE_CURRENT_LIST_DIR}/config.h.in"
               "${PERSEUS_GENERATED_DIR}/perseus/config.h" @ONLY)

# A build tree holds the `perseus` package where an installation would, beside its library
# (build/lib/framework_shims, a link into the source tree), so that the build tree's perseusrun
# finds it from its own path (no source path in perseus/config.h).
# An in-source build (the build folder is the source tree) already has the folder itself.
set(perseus_build_tree_package "${CMAKE_BINARY_DIR}/lib/framework_shims")
if(IS_SYMLINK "${perseus_build_tree_package}" OR NOT EXISTS "${perseus_build_tree_package}")
  file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/lib")
  file(CREATE_LINK "${PROJECT_SOURCE_DIR}/lib/framework_shims" "${perseus_build_tree_package}"
       SYMBOLIC)
endif()

add_library(perseus_config INTERFACE)
target_include_directories(perseus_config INTERFACE "${PERSEUS_GENERATED_DIR}")
