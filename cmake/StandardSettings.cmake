# Language level, warnings and sanitizers as INTERFACE targets that every target links, so that
# no directory-wide flag is needed.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_C_STANDARD 99)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)

add_library(perseus_warnings INTERFACE)
target_compile_options(perseus_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor> -Wcast-align
  -Wunused
  -Wconversion -Wno-sign-conversion -Wformat=2 -Werror=return-type
  # Aggregates with default member initializers are meant to be partly initialised.
  -Wno-missing-field-initializers)

add_library(perseus_sanitizers INTERFACE)
if(PERSEUS_SANITIZE)
  target_compile_options(perseus_sanitizers INTERFACE
    -fsanitize=${PERSEUS_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(perseus_sanitizers INTERFACE -fsanitize=${PERSEUS_SANITIZE})
endif()

add_library(perseus_settings INTERFACE)
target_link_libraries(perseus_settings INTERFACE perseus_warnings perseus_sanitizers)
