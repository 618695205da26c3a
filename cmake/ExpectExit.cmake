# cmake -DEXE=... -DARGS="a;b" -DEXPECT_RC=N [-DEXPECT_ERR=substring] -P ExpectExit.cmake
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "expected exit ${EXPECT_RC}, got ${rc}\nstderr: ${err}")
endif()
if(DEFINED EXPECT_ERR AND NOT err MATCHES "${EXPECT_ERR}")
  message(FATAL_ERROR "stderr lacks '${EXPECT_ERR}': ${err}")
endif()
