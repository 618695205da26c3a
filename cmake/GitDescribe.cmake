# cmake -DSRC=<source dir> -DOUT=<header> -P GitDescribe.cmake
# Writes OB_GIT_DESCRIBE into OUT, touching it only when it changes, so
# --version names the commit that was built without rebuilding every time.
execute_process(COMMAND git -C ${SRC} describe --always --dirty
  OUTPUT_VARIABLE describe OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(content "// Generated at build time by cmake/GitDescribe.cmake.\n#pragma once\n#define OB_GIT_DESCRIBE \"${describe}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${content}")
  file(WRITE ${OUT} "${content}")
endif()
