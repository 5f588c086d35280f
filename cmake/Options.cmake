# Build switches. Each optional dependency is AUTO (found means built, missing means a message
# that names the switch), ON (missing is a fatal error) or OFF.
set(PERSEUS_WITH_CUDA AUTO CACHE STRING "Build CUDA support: AUTO, ON or OFF")
set(PERSEUS_WITH_NCCL AUTO CACHE STRING "Build NCCL support: AUTO, ON or OFF")
set_property(CACHE PERSEUS_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set_property(CACHE PERSEUS_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)

option(PERSEUS_BUILD_TESTS "Build the unit and black-box tests" ON)
option(PERSEUS_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
set(PERSEUS_SANITIZE "" CACHE STRING
    "Comma-separated sanitizers for every target, e.g. address,undefined")

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()
