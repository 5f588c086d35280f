# Build switches. There is none for CUDA or NCCL: neither is needed to build, libperseus loads
# them at run time where a rank has them (cmake/Dependencies.cmake).
option(PERSEUS_BUILD_TESTS "Build the unit and black-box tests" ON)
option(PERSEUS_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
set(PERSEUS_SANITIZE "" CACHE STRING
    "Comma-separated sanitizers for every target, e.g. address,undefined")

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()
