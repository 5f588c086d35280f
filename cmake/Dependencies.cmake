# Every dependency comes from Debian's packages, except CUDA and NCCL, which come from the
# machine's CUDA toolkit and are optional (see Options.cmake).
find_package(Threads REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBSSH2 REQUIRED IMPORTED_TARGET libssh2)
if(PERSEUS_BUILD_TESTS)
  find_package(doctest CONFIG REQUIRED)
  # The black-box tests need pytest, which the set-up script installs for Debian's python3
  # (python3-pytest); prefer that interpreter over whatever python3 comes first on PATH.
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
endif()

# Resolves an AUTO/ON/OFF switch against whether the dependency was found.
function(perseus_resolve_optional switch found what)
  if(${switch} STREQUAL "OFF")
    set(${switch}_ENABLED 0 PARENT_SCOPE)
  elseif(${found})
    set(${switch}_ENABLED 1 PARENT_SCOPE)
    message(STATUS "Perseus: ${what} found, building with it")
  elseif(${switch} STREQUAL "ON")
    message(FATAL_ERROR "Perseus: ${switch}=ON but ${what} was not found. Install it or "
                        "configure with -D${switch}=OFF.")
  else()
    set(${switch}_ENABLED 0 PARENT_SCOPE)
    message(STATUS "Perseus: ${what} not found, building without it "
                   "(-D${switch}=ON makes this an error)")
  endif()
endfunction()

set(PERSEUS_CUDA_VERSION "")
if(NOT PERSEUS_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
endif()
perseus_resolve_optional(PERSEUS_WITH_CUDA CUDAToolkit_FOUND "the CUDA toolkit")
if(PERSEUS_WITH_CUDA_ENABLED)
  set(PERSEUS_CUDA_VERSION "${CUDAToolkit_VERSION}")
endif()

set(PERSEUS_NCCL_VERSION "")
set(NCCL_FOUND FALSE)
if(NOT PERSEUS_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" nccl_version_lines
         REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX REPLACE ".*NCCL_${part} ([0-9]+).*" "\\1" NCCL_${part}
                           "${nccl_version_lines}")
    endforeach()
    set(PERSEUS_NCCL_VERSION "${NCCL_MAJOR}.${NCCL_MINOR}.${NCCL_PATCH}")
    set(NCCL_FOUND TRUE)
  endif()
endif()
perseus_resolve_optional(PERSEUS_WITH_NCCL NCCL_FOUND "NCCL")
