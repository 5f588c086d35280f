# Publishes the configure-time results as 0/1 macros and version strings in perseus/config.h.
set(PERSEUS_LIBSSH2_VERSION "${LIBSSH2_VERSION}")
set(PERSEUS_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")
configure_file("${CMAKE_CURRENT_LIST_DIR}/config.h.in"
               "${PERSEUS_GENERATED_DIR}/perseus/config.h" @ONLY)

add_library(perseus_config INTERFACE)
target_include_directories(perseus_config INTERFACE "${PERSEUS_GENERATED_DIR}")
