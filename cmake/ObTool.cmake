# ob_add_tool(NAME SOURCES... [TORCH])
# Builds ob-NAME from tools/NAME, links the library (ob_torch when TORCH is
# given, else the torch-free ob_core), installs it, and registers its
# --help / --version / bad-option tests.
function(ob_add_tool name)
  cmake_parse_arguments(T "TORCH" "" "" ${ARGN})
  set(target ob-${name})
  add_executable(${target} ${T_UNPARSED_ARGUMENTS})
  if(T_TORCH)
    target_link_libraries(${target} PRIVATE ob_torch)
    ob_use_torch_pch(${target})
  else()
    target_link_libraries(${target} PRIVATE ob_core)
  endif()
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  install(TARGETS ${target} RUNTIME DESTINATION bin)
  if(OB_BUILD_TESTS)
    add_test(NAME cli.${name}.help COMMAND $<TARGET_FILE:${target}> --help)
    set_tests_properties(cli.${name}.help PROPERTIES PASS_REGULAR_EXPRESSION "Usage: ob-${name}")
    add_test(NAME cli.${name}.version COMMAND $<TARGET_FILE:${target}> --version)
    set_tests_properties(cli.${name}.version PROPERTIES PASS_REGULAR_EXPRESSION "^ob-${name} [0-9]+\\.[0-9]+\\.[0-9]+")
    add_test(NAME cli.${name}.bad_option
      COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DARGS=--no-such-option -DEXPECT_RC=64
              -DEXPECT_ERR=--help -P ${PROJECT_SOURCE_DIR}/cmake/ExpectExit.cmake)
  endif()
endfunction()
