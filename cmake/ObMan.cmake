# ob_add_man(page.N.scd ...): renders man pages with scdoc when it is
# installed; without scdoc the build goes on and installs no pages.
find_program(OB_SCDOC scdoc)
function(ob_add_man)
  if(NOT OB_SCDOC)
    return()
  endif()
  foreach(src ${ARGN})
    get_filename_component(page ${src} NAME_WLE)          # ob-profile.1
    string(REGEX REPLACE ".*\\.([0-9])$" "\\1" section ${page})
    set(out ${PROJECT_BINARY_DIR}/man/${page})
    add_custom_command(OUTPUT ${out}
      COMMAND sh -c "\"$0\" < \"$1\" > \"$2\"" ${OB_SCDOC} ${CMAKE_CURRENT_SOURCE_DIR}/${src} ${out}
      DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${src} VERBATIM)
    list(APPEND outs ${out})
    install(FILES ${out} DESTINATION share/man/man${section})
  endforeach()
  add_custom_target(man ALL DEPENDS ${outs})
endfunction()
