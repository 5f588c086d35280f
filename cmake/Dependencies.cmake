# Every dependency comes from Debian's packages.
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

# CUDA and NCCL are never linked or needed to build: libperseus loads the CUDA runtime and NCCL
# with dlopen where a rank has them (lib/comm/nccl), so one build serves hosts with and without
# GPUs.
