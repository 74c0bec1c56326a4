# One way to declare every target, in the spirit of absl_cc_library / absl_cc_test.
#
#   shoal_cc_library(NAME core SRCS a.cc HDRS a.h DEPS fmt::fmt)
#   shoal_cc_test(NAME core_status_test SRCS status_test.cc DEPS shoal_core)
#   shoal_cc_binary(NAME shoal SRCS main.cc DEPS shoal_runtime)
#   shoal_cc_benchmark(NAME runtime_benchmark SRCS b.cc DEPS shoal_runtime)
#
# Library targets are named shoal_<NAME>. Tests are registered with CTest and carry the
# label "unit" unless LABELS says otherwise (e2e tests use "e2e"; sanitizer builds run
# only the unit label).

include(CMakeParseArguments)

function(shoal_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS;PUBLIC_DEFS" ${ARGN})
  set(target shoal_${ARG_NAME})
  if(ARG_SRCS)
    add_library(${target} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_link_libraries(${target} PUBLIC ${ARG_DEPS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/src
                                               ${PROJECT_SOURCE_DIR}/include)
    target_compile_options(${target} PRIVATE ${SHOAL_WARNINGS})
    target_compile_definitions(${target} PUBLIC ${ARG_PUBLIC_DEFS})
  else()
    add_library(${target} INTERFACE)
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR}/src
                                                  ${PROJECT_SOURCE_DIR}/include)
  endif()
endfunction()

function(shoal_cc_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  if(NOT SHOAL_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ARG_NAME} PRIVATE ${SHOAL_WARNINGS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} ${ARG_ARGS})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "SHOAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};SHOAL_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()

function(shoal_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  target_compile_options(${ARG_NAME} PRIVATE ${SHOAL_WARNINGS})
endfunction()

function(shoal_cc_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT SHOAL_BUILD_BENCHMARKS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  target_compile_options(${ARG_NAME} PRIVATE ${SHOAL_WARNINGS})
endfunction()

# A shared library loaded by the plugin backend at run time (no "lib" prefix games:
# the file is libshoal_<NAME>.so, which is what the plugin loader looks for).
function(shoal_plugin)
  cmake_parse_arguments(ARG "" "NAME" "SRCS" ${ARGN})
  add_library(shoal_${ARG_NAME} MODULE ${ARG_SRCS})
  set_target_properties(shoal_${ARG_NAME} PROPERTIES PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/backends)
  target_include_directories(shoal_${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(shoal_${ARG_NAME} PRIVATE ${SHOAL_WARNINGS})
endfunction()
