# zps_cc_library / zps_cc_binary / zps_cc_test: every target gets the same shape.
# Modelled on Abseil's absl_cc_library.
include(GNUInstallDirs)

function(zps_set_global_flags)
  set(warn -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers)
  if(ZPS_WERROR)
    list(APPEND warn -Werror)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 reports false positives inside its own AVX-512 intrinsic headers (_mm512_undefined_*).
    list(APPEND warn -Wno-maybe-uninitialized)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # -beta adds the lock-order check: the ACQUIRED_BEFORE / ACQUIRED_AFTER annotations.
    list(APPEND warn -Wthread-safety -Wthread-safety-beta)
  endif()
  set(ZPS_WARNINGS ${warn} PARENT_SCOPE)
  set(ZPS_WARNINGS ${warn} CACHE INTERNAL "")
  if(ZPS_SANITIZE STREQUAL "address")
    add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
    add_link_options(-fsanitize=address,undefined)
  elseif(ZPS_SANITIZE STREQUAL "thread")
    add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
    add_link_options(-fsanitize=thread)
  elseif(NOT ZPS_SANITIZE STREQUAL "")
    message(FATAL_ERROR "ZPS_SANITIZE must be '', 'address' or 'thread'")
  endif()
  if(ZPS_FUZZ)
    if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      message(FATAL_ERROR "ZPS_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
    endif()
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
endfunction()

# zps_cc_library(NAME common SRCS a.cc b.cc DEPS Threads::Threads [PUBLIC_DEPS ...])
# Creates target zps_<NAME> with alias zps::<NAME>; public headers in <dir>/include. The library
# and its headers are installed (lib/, include/zps/<dir>/) and exported as zps::<NAME> in the
# zps CMake package (cmake/zpsConfig.cmake.in; find_package(zps CONFIG)).
function(zps_cc_library)
  cmake_parse_arguments(Z "" "NAME" "SRCS;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(zps_${Z_NAME} STATIC ${Z_SRCS})
  add_library(zps::${Z_NAME} ALIAS zps_${Z_NAME})
  target_include_directories(zps_${Z_NAME}
                             PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                                    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                             PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(zps_${Z_NAME} PUBLIC ${Z_PUBLIC_DEPS} PRIVATE ${Z_DEPS})
  target_compile_options(zps_${Z_NAME} PRIVATE ${ZPS_WARNINGS})
  set_target_properties(zps_${Z_NAME} PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME ${Z_NAME})
  install(TARGETS zps_${Z_NAME} EXPORT zpsTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include)
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endfunction()

# zps_cc_binary(NAME zps-server SRCS main.cc DEPS zps::server [NO_INSTALL])
# Programs are installed into bin/ unless NO_INSTALL.
function(zps_cc_binary)
  cmake_parse_arguments(Z "NO_INSTALL" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${Z_NAME} ${Z_SRCS})
  target_link_libraries(${Z_NAME} PRIVATE ${Z_DEPS})
  target_compile_options(${Z_NAME} PRIVATE ${ZPS_WARNINGS})
  if(NOT Z_NO_INSTALL)
    install(TARGETS ${Z_NAME} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endfunction()

# zps_cc_test(NAME common SRCS a_test.cc DEPS zps::common [LABELS unit gpu] [ISA_MATRIX])
# Builds build/bin/test_<NAME> and registers its gtest cases with ctest. With ISA_MATRIX the cases
# are registered once per ISA (scalar., avx2., avx512. prefixes) with ZPS_ISA set; a case skips
# itself when the CPU lacks that ISA.
function(zps_cc_test)
  cmake_parse_arguments(Z "ISA_MATRIX" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(test_${Z_NAME} ${Z_SRCS})
  target_link_libraries(test_${Z_NAME} PRIVATE ${Z_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_options(test_${Z_NAME} PRIVATE ${ZPS_WARNINGS})
  if(NOT Z_LABELS)
    set(Z_LABELS unit)
  endif()
  include(GoogleTest)
  if(Z_ISA_MATRIX)
    foreach(isa scalar avx2 avx512)
      gtest_discover_tests(test_${Z_NAME} TEST_PREFIX "${isa}." DISCOVERY_TIMEOUT 60
                           PROPERTIES LABELS "${Z_LABELS}" ENVIRONMENT "ZPS_ISA=${isa}")
    endforeach()
  else()
    gtest_discover_tests(test_${Z_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${Z_LABELS}")
  endif()
endfunction()
